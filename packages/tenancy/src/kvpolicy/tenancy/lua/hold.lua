-- After common.lua.
-- No script ARGV: open (or extend) the recovery window; a replica that saw Redis fail calls
-- it first thing when Redis answers again.
local p, K = pool_state()
if recovery > 0 then p.rec = math.max(p.rec, now + recovery) end
save_pool(p)
return 1
