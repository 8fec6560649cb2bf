-- After common.lua.
-- ARGV 17..: id, tenant, tokens, kv, ttl_s, idle_s, spec, concurrency, rate, depth, kv bytes
-- (the entitlement's limits), then GateConfig's overcommit (1 or 0) and contention level,
-- and the reserved token rates' window (held back from the pool's bucket when the pool is
-- hard). Whether the request is within its reserved baseline is decided in the script.
-- Returns {1} admitted; {-1} duplicate; or {0, reason, slots, kv, tokens, in_flight,
-- in_flight_tokens, in_flight_kv, drain} for the Retry-After.
local id, tenant = ARGV[17], ARGV[18]
local tok, kv, ttl, idle = tonumber(ARGV[19]), tonumber(ARGV[20]), tonumber(ARGV[21]), ARGV[22]
local spec = ARGV[23]
local conc, rate, depth, kvcap = tonumber(ARGV[24]), tonumber(ARGV[25]), tonumber(ARGV[26]),
                                 tonumber(ARGV[27])
local overcommit, frac, held = tonumber(ARGV[28]), tonumber(ARGV[29]), tonumber(ARGV[30])
if redis.call('HEXISTS', data, id) == 1 then return {-1} end
local p, K = pool_state()
if now < p.rec then
  save_pool(p)
  return {0, 'state-unavailable', fmt(p.rec - now), '0', '0', '0', '0', '0', '0'}
end
reclaim(p, K, idle, 8, ttl)
local s = ent(tenant, spec, K)
local e = s.e
local function deny(reason, a, b, c, n, t, k, drain)
  if not s.new then save(s, idle) end
  save_pool(p)
  return {0, reason, fmt(a), fmt(b), fmt(c), fmt(n), fmt(t), fmt(k), fmt(drain)}
end
local st = math.max(now, s.bt)
local level = math.min(depth, s.b + (st - s.bt) * rate)
local pt = math.max(now, p.bt)
local plevel = math.min(pdepth, p.b + (pt - p.bt) * prate)
local drain = math.min(rate, prate)
if s.inf + 1 > conc then return deny('concurrency', 1, 0, 0, s.inf, s.tok, s.kv, drain) end
if tok > level then
  return deny('tokens', 0, 0, tok - level, s.inf, s.tok, s.kv, rate)
end
if s.kv + kv > kvcap then
  return deny('kv-cache', 0, s.kv + kv - kvcap, 0, s.inf, s.tok, s.kv, drain)
end
local reserved = e.prot == 1 and s.inf + 1 <= e.bconc and s.kv + kv <= e.bkv
if reserved and overcommit == 0 and tok > plevel then
  s.cont = s.cont + 1
  s.new = false
  return deny('pool-full', 0, 0, tok - plevel, 0, 0, 0, prate)
end
local over = false -- admitted over a contended pool on priority: contention, as a denial
if not reserved then
  local slots_after = p.inf + (resslots - p.rus) + 1
  local kv_after = p.kv + (reskv - p.ruk) + kv
  local need_slots, need_kv, need_tok = slots_after - pconc, kv_after - pkvcap, tok - plevel
  local reason = nil
  if overcommit == 0 then need_tok = need_tok + held end
  if overcommit == 0 and (need_slots > 0 or need_kv > 0 or need_tok > 0) then
    reason = 'pool-full'
  else
    if frac < 1 then
      need_slots = slots_after - frac * pconc
      need_kv = kv_after - frac * pkvcap
      need_tok = need_tok + (1 - frac) * pdepth
    end
    if need_slots > 0 or need_kv > 0 or need_tok > 0 then
      over = true
      local ok = weight(s) > threshold(p, K, idle)
      if ok and e.prot == 1 then
        ok = p.pinf + resslots - p.rus + 1 <= pconc and p.pkv + reskv - p.ruk + kv <= pkvcap
      end
      if not ok then reason = 'priority' end
    end
  end
  if reason then
    s.cont = s.cont + 1
    s.new = false
    return deny(reason, math.max(0, need_slots), math.max(0, need_kv),
                math.max(0, need_tok), p.inf, p.tok, p.kv, prate)
  end
end
take(s, p, tok, kv)
s.b, s.bt, s.served = level - tok, st, s.served + tok
if over then s.cont = s.cont + 1 end
p.b, p.bt = plevel - tok, pt
save(s, idle)
save_pool(p)
redis.call('HSET', data, id, fmt(tok) .. ' ' .. fmt(kv) .. ' ' .. tenant)
redis.call('ZADD', leases, fmt(now + ttl), id)
return {1}
