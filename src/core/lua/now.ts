// A module of its own: the uses' and the quorum's scripts take it without the lock's pieces.

// Shared preamble: the server clock in microseconds and milliseconds. Microseconds since the
// epoch are about 1.8e15, well inside the 2^53 that Lua doubles and JSON numbers hold exactly.
// ttlOrSet: a key's TTL; one without a TTL (a PERSIST, a restore, a hand repair) would hold its
// name forever, so it gets `ms` now. Only for keys that exist.
export const NOW = `
local time  = redis.call('TIME')
local nowUs = tonumber(time[1]) * 1000000 + tonumber(time[2])
local nowMs = math.floor(nowUs / 1000)
local function ttlOrSet(key, ms)
  local pttl = redis.call('PTTL', key)
  if pttl >= 0 then return pttl end
  redis.call('PEXPIRE', key, ms)
  return ms
end
`;
