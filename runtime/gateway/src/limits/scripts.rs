//! The store's two Lua scripts. Each runs atomically in the store (one round trip), on the store's
//! clock (`TIME`), so gateway replicas whose clocks differ still share one bucket.
//!
//! Buckets are hashes `{l: level, t: ms}` refilled continuously at `limit / 60 000` per millisecond up
//! to `limit` (a request or token bucket of one minute); a missing bucket is full. A level may go
//! below zero when tokens are charged after the fact (debt): the tenant waits until it refills past 1.

/// Admission. KEYS: requests bucket, tokens bucket, leases (sorted set), day spend, month spend.
/// ARGV: rpm, tpm, max concurrent, day budget, month budget (0 = none; money in millionths), lease id,
/// lease lifetime ms, ms to the day's end, ms to the month's end, prompt-token estimate.
/// Returns `{refusal, wait ms, requests level, tokens level, day spend, month spend}` (`""` = admitted).
pub const ADMIT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function level(key, limit)
  local v = redis.call('HMGET', key, 'l', 't')
  local l, at = tonumber(v[1]), tonumber(v[2])
  if l == nil or at == nil then return limit end
  local refill = (now - at) * limit / 60000
  if refill < 0 then refill = 0 end
  return math.min(limit, l + refill)
end
local rpm, tpm, conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local dayb, monb = tonumber(ARGV[4]), tonumber(ARGV[5])
local rq, tk = 0, 0
if rpm > 0 then rq = level(KEYS[1], rpm) end
if tpm > 0 then tk = level(KEYS[2], tpm) end
local day = tonumber(redis.call('GET', KEYS[4]) or '0')
local month = tonumber(redis.call('GET', KEYS[5]) or '0')
local refusal, wait = '', 0
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= conc then refusal, wait = 'concurrency', 1000 end
end
if refusal == '' and monb > 0 and month >= monb then refusal, wait = 'monthly_budget', tonumber(ARGV[9]) end
if refusal == '' and dayb > 0 and day >= dayb then refusal, wait = 'daily_budget', tonumber(ARGV[8]) end
if refusal == '' and rpm > 0 and rq < 1 then refusal, wait = 'requests', math.ceil((1 - rq) * 60000 / rpm) end
if refusal == '' and tpm > 0 and tk < 1 then refusal, wait = 'tokens', math.ceil((1 - tk) * 60000 / tpm) end
if refusal == '' then
  if rpm > 0 then rq = rq - 1 end
  if tpm > 0 then tk = tk - tonumber(ARGV[10]) end
  if conc > 0 then
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[7]), ARGV[6])
    redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]) * 2)
  end
end
if rpm > 0 then
  redis.call('HSET', KEYS[1], 'l', tostring(rq), 't', tostring(now))
  redis.call('PEXPIRE', KEYS[1], 120000)
end
if tpm > 0 then
  redis.call('HSET', KEYS[2], 'l', tostring(tk), 't', tostring(now))
  redis.call('PEXPIRE', KEYS[2], 120000)
end
return {refusal, tostring(wait), tostring(rq), tostring(tk), tostring(day), tostring(month)}
"#;

/// A charge after the fact. KEYS: tokens bucket, day spend, month spend. ARGV: tpm (0 = none), tokens
/// (may be negative: a refund of an estimate), cost in millionths, day key lifetime ms, month key
/// lifetime ms. Returns the tokens level.
pub const CHARGE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tpm, tokens, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tk = 0
if tpm > 0 and tokens ~= 0 then
  local v = redis.call('HMGET', KEYS[1], 'l', 't')
  local l, at = tonumber(v[1]), tonumber(v[2])
  if l == nil or at == nil then tk = tpm else
    local refill = (now - at) * tpm / 60000
    if refill < 0 then refill = 0 end
    tk = math.min(tpm, l + refill)
  end
  tk = tk - tokens
  redis.call('HSET', KEYS[1], 'l', tostring(tk), 't', tostring(now))
  redis.call('PEXPIRE', KEYS[1], 120000)
end
if cost > 0 then
  redis.call('INCRBY', KEYS[2], cost)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]))
  redis.call('INCRBY', KEYS[3], cost)
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[5]))
end
return tostring(tk)
"#;
