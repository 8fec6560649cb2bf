-- Shared Lua: seed 004's admission state (§4.3) kept whole in Redis, so that one script is
-- one atomic decision. KEYS: pool hash, lease expiries (sorted set), lease data (hash
-- id -> "tokens kv tenant"), in-flight priorities (sorted set tenant -> weight), recent
-- releases (sorted set id -> time).
-- Common ARGV: ns, now ('' = Redis's clock), update interval, alpha_slo, alpha_burst,
-- alpha_debt, gamma_d, gamma_b, pool-mean SLO, pool rate, depth, concurrency, KV bytes,
-- reserved KV bytes, reserved slots, recovery seconds. Script ARGV start at 17.
--
-- The pool hash's ``rec`` is the end of a recovery window: until then no request is
-- admitted (``state-unavailable``), while renewals re-adopt what the replicas hold. It opens
-- when a script finds the pool's state gone (Redis restarted without it) and when a replica
-- that saw Redis fail comes back (RedisLeaseGate._reconcile): every replica then has
-- the window to push its leases and outage admissions before anyone is admitted again (the
-- "delayed restart" that Redlock prescribes for the same reason).
--
-- An entitlement hash holds its in-flight counters, token bucket, burst, debt, the tokens
-- served and contended decisions (pool denials, admissions over a contended pool on
-- priority) of its current control interval ``k``, and its spec
-- "class_weight slo baseline_rate baseline_kv baseline_slots debt? reserved? rate depth".
-- The debt and burst updates of eqs. (2)-(3) run lazily: an entitlement is brought up to the
-- current interval when a script touches it, one interval with its served tokens and the
-- idle rest in closed form, so the update costs O(1) per decision whatever the number of
-- tenants. Weights of entitlements in flight (the admission threshold) are refreshed once
-- per interval, when a contended decision first needs them.
local ns = ARGV[1]
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local I = tonumber(ARGV[3])
local aslo, ab, ad = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local gd, gb, mean = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local prate, pdepth = tonumber(ARGV[10]), tonumber(ARGV[11])
local pconc, pkvcap = tonumber(ARGV[12]), tonumber(ARGV[13])
local reskv, resslots = tonumber(ARGV[14]), tonumber(ARGV[15])
local recovery = tonumber(ARGV[16])
local poolkey, leases, data, prio, gone = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local EF = {'inf', 'kv', 'tok', 'b', 'bt', 'burst', 'debt', 'served', 'cont', 'k', 'spec'}
local PF = {'inf', 'kv', 'tok', 'b', 'bt', 'pinf', 'pkv', 'rus', 'ruk', 'k', 'wk', 'rec'}
local function fmt(x) return string.format('%.17g', x) end
local function parse(spec)
  local t = {}
  for w in string.gmatch(spec, '%S+') do t[#t + 1] = tonumber(w) end
  return {cw = t[1], slo = t[2], btps = t[3], bkv = t[4], bconc = t[5], acc = t[6],
          prot = t[7], rate = t[8], depth = t[9]}
end
local function catch_up(s, K)
  if K <= s.k then return end
  local e, idle = s.e, K - s.k - 1
  local served = math.max(0, s.served) / I
  if e.acc == 1 then
    local gap = math.max(-1, math.min(1, (e.btps - served) / e.btps))
    if s.cont == 0 then gap = math.min(0, gap) end
    s.debt = gd * s.debt + (1 - gd) * gap
    s.debt = s.debt * gd ^ idle
  end
  local kvo = math.max(0, s.kv / e.bkv - 1)
  local co = math.max(0, s.inf / e.bconc - 1)
  local delta = math.max(0, served / e.btps - 1) + kvo + co
  s.burst = gb * s.burst + (1 - gb) * delta
  if idle > 0 then
    local st = kvo + co
    s.burst = st + (s.burst - st) * gb ^ idle
  end
  s.served, s.cont, s.k = 0, 0, K
end
-- The entitlement of ``tenant`` brought up to interval K; a fresh one from ``spec`` (nil
-- when there is neither a state nor a spec).
local function ent(tenant, spec, K)
  local key = ns .. ':e:' .. tenant
  local v = redis.call('HMGET', key, unpack(EF))
  local s = {key = key, tenant = tenant}
  if not v[4] then
    if not spec then return nil end
    s.new, s.spec, s.e = true, spec, parse(spec)
    s.inf, s.kv, s.tok, s.burst, s.debt, s.served, s.cont, s.k = 0, 0, 0, 0, 0, 0, 0, K
    s.b, s.bt = s.e.depth, now
    return s
  end
  for i = 1, 10 do s[EF[i]] = tonumber(v[i]) end
  s.spec = spec or v[11]
  s.e = parse(s.spec)
  catch_up(s, K)
  return s
end
local function save(s, idle)
  redis.call('HSET', s.key, 'inf', fmt(s.inf), 'kv', fmt(s.kv), 'tok', fmt(s.tok),
             'b', fmt(s.b), 'bt', fmt(s.bt), 'burst', fmt(s.burst), 'debt', fmt(s.debt),
             'served', fmt(s.served), 'cont', fmt(s.cont), 'k', fmt(s.k), 'spec', s.spec)
  redis.call('EXPIRE', s.key, idle)
end
local function weight(s)
  local e, d = s.e, s.debt
  local owed
  if d >= 0 then owed = 1 + ad * d else owed = 1 / (1 - ad * d) end
  return e.cw / (1 + aslo * e.slo / mean) / (1 + ab * s.burst) * owed
end
-- The pool's state and the current interval (never earlier than one already seen).
local function pool_state()
  local v = redis.call('HMGET', poolkey, unpack(PF))
  local p = {}
  for i, f in ipairs(PF) do p[f] = tonumber(v[i]) or 0 end
  if not v[4] then
    p.b = pdepth
    if recovery > 0 then p.rec = now + recovery end
  end
  local K = math.max(math.floor(now / I), p.k)
  p.k = K
  return p, K
end
local function save_pool(p)
  redis.call('HSET', poolkey, 'inf', fmt(p.inf), 'kv', fmt(p.kv), 'tok', fmt(p.tok),
             'b', fmt(p.b), 'bt', fmt(p.bt), 'pinf', fmt(p.pinf), 'pkv', fmt(p.pkv),
             'rus', fmt(p.rus), 'ruk', fmt(p.ruk), 'k', fmt(p.k), 'wk', fmt(p.wk),
             'rec', fmt(p.rec))
end
-- Count one more request of ``s`` in flight (no limit checked).
local function take(s, p, tok, kv)
  local e, n = s.e, s.inf
  if e.prot == 1 then
    p.pinf = p.pinf + 1
    p.pkv = p.pkv + kv
    p.rus = p.rus + (math.min(n + 1, e.bconc) - math.min(n, e.bconc))
    p.ruk = p.ruk + (math.min(s.kv + kv, e.bkv) - math.min(s.kv, e.bkv))
  end
  if n == 0 then redis.call('ZADD', prio, fmt(weight(s)), s.tenant) end
  s.inf, s.kv, s.tok = n + 1, s.kv + kv, s.tok + tok
  p.inf, p.kv, p.tok = p.inf + 1, p.kv + kv, p.tok + tok
end
-- Free lease ``id``; ``actual`` >= 0 books that many tokens (clamped) instead of the charge.
local function free(id, actual, p, K, idle)
  local v = redis.call('HGET', data, id)
  if not v then return nil end
  local tok, kv, tenant = string.match(v, '^(%d+) (%d+) (.*)$')
  tok, kv = tonumber(tok), tonumber(kv)
  redis.call('HDEL', data, id)
  redis.call('ZREM', leases, id)
  local refund = 0
  if actual >= 0 then refund = tok - math.min(actual, tok) end
  local s = ent(tenant, nil, K)
  if s then
    local e, n = s.e, s.inf
    local st = math.max(now, s.bt)
    s.b = math.min(e.depth, s.b + (st - s.bt) * e.rate + refund)
    s.bt = st
    if e.prot == 1 then
      p.pinf = p.pinf - 1
      p.pkv = p.pkv - kv
      p.rus = p.rus - (math.min(n, e.bconc) - math.min(n - 1, e.bconc))
      p.ruk = p.ruk - (math.min(s.kv, e.bkv) - math.min(s.kv - kv, e.bkv))
    end
    s.inf, s.kv, s.tok = n - 1, s.kv - kv, s.tok - tok
    s.served = s.served - refund
    save(s, idle)
    if s.inf <= 0 then redis.call('ZREM', prio, tenant) end
  end
  local pt = math.max(now, p.bt)
  p.b = math.min(pdepth, p.b + (pt - p.bt) * prate + refund)
  p.bt = pt
  p.inf, p.kv, p.tok = p.inf - 1, p.kv - kv, p.tok - tok
  return tok
end
-- Free the expired leases (at most ``limit``); forget releases older than ``ttl``.
local function reclaim(p, K, idle, limit, ttl)
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', fmt(now), 'LIMIT', 0, limit)
  for _, id in ipairs(expired) do free(id, -1, p, K, idle) end
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', fmt(now - ttl))
  return #expired
end
-- Admission threshold: the least weight among entitlements in flight (inf when none).
local function threshold(p, K, idle)
  if p.wk < K then
    for _, t in ipairs(redis.call('ZRANGE', prio, 0, -1)) do
      local o = ent(t, nil, K)
      if o == nil or o.inf <= 0 then
        redis.call('ZREM', prio, t)
      else
        save(o, idle)
        redis.call('ZADD', prio, fmt(weight(o)), t)
      end
    end
    p.wk = K
  end
  local m = redis.call('ZRANGE', prio, 0, 0, 'WITHSCORES')
  if #m == 0 then return math.huge end
  return tonumber(m[2])
end
