-- After common.lua.
-- ARGV 17..: idle_s, ttl_s, then (id, tenant, tokens, kv, spec) per lease held by the caller.
-- Extends each lease; re-adopts one Redis lost (a restart, or an expiry while its holder was
-- stalled), counting it again without a limit check: the request is really running. A lease
-- released since the caller listed it (a release racing the renewal: the ``released`` set
-- remembers releases for one TTL) is neither renewed nor adopted.
-- Returns {renewed, adopted, reclaimed}.
local idle, ttl = ARGV[17], tonumber(ARGV[18])
local p, K = pool_state()
local reclaimed = reclaim(p, K, idle, 64, ttl)
local renewed, adopted = 0, 0
for i = 19, #ARGV, 5 do
  local id, tenant = ARGV[i], ARGV[i + 1]
  if redis.call('HEXISTS', data, id) == 1 then
    renewed = renewed + 1
    redis.call('EXPIRE', ns .. ':e:' .. tenant, idle)
    redis.call('ZADD', leases, fmt(now + ttl), id)
  elseif redis.call('ZSCORE', gone, id) then
    -- released after the caller listed it: nothing to renew, nothing to adopt
  else
    local tok, kv = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
    local s = ent(tenant, ARGV[i + 4], K)
    take(s, p, tok, kv)
    save(s, idle)
    redis.call('HSET', data, id, fmt(tok) .. ' ' .. fmt(kv) .. ' ' .. tenant)
    redis.call('ZADD', leases, fmt(now + ttl), id)
    adopted = adopted + 1
  end
end
save_pool(p)
return {renewed, adopted, reclaimed}
