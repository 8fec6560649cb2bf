-- After common.lua.
-- ARGV 17..: idle_s, tenant, spec. Returns {debt, burst, weight} as of now.
local p, K = pool_state()
local s = ent(ARGV[18], ARGV[19], K)
if not s.new then save(s, ARGV[17]) end
save_pool(p)
return {fmt(s.debt), fmt(s.burst), fmt(weight(s))}
