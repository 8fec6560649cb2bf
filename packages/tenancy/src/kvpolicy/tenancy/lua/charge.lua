-- After common.lua.
-- ARGV 17..: idle_s, tenant, tokens, spec: book tokens served while Redis was away.
local p, K = pool_state()
local amount = tonumber(ARGV[19])
local s = ent(ARGV[18], ARGV[20], K)
s.b, s.served = s.b - amount, s.served + amount
save(s, ARGV[17])
p.b = p.b - amount
save_pool(p)
return 1
