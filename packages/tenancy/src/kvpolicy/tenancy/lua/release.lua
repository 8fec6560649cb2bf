-- After common.lua.
-- ARGV 17..: id, actual (-1: charge in full), idle_s. Returns {charged or -1, debt, weight}.
local p, K = pool_state()
local v = redis.call('HGET', data, ARGV[17])
local tok = free(ARGV[17], tonumber(ARGV[18]), p, K, ARGV[19])
save_pool(p)
if not tok then return {-1, '0', '0'} end
redis.call('ZADD', gone, fmt(now), ARGV[17])
local tenant = string.match(v, '^%d+ %d+ (.*)$')
local s = ent(tenant, nil, K)
if not s then return {fmt(tok), '', ''} end
return {fmt(tok), fmt(s.debt), fmt(weight(s))}
