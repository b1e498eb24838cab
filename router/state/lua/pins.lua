-- Helpers of ops.lua kept apart: hash reads and writes in batches, and the blocks pinned by
-- bookings in flight. router/state/redis_calls.py sends this file and ops.lua as one script,
-- this one first.

local function hmget_all(key, fields, out)
  for i = 1, #fields, 4000 do
    local part = redis.call('HMGET', key, unpack(fields, i, math.min(#fields, i + 3999)))
    for j = 1, #part do out[#out + 1] = part[j] or '' end
  end
  return out
end

local function hset_all(key, pairs_)
  for i = 1, #pairs_, 4000 do redis.call('HSET', key, unpack(pairs_, i, math.min(#pairs_, i + 3999))) end
end

-- Pinned blocks (router/state/pins.py): per instance an epoch (its life), started by its first
-- pinning booking and ended when the instance is dropped ('F' with drop_load); a block's count
-- lives under its epoch, so a booking from before a drop releases into its own (ended) epoch
-- and never touches the counts or the load of the instance's next life. Bounded: at most cap
-- distinct blocks per epoch (a booking pins its leading blocks and stops at the first new one
-- beyond the cap; the rest is booked as its own KV), one epoch field per instance, and an
-- ended epoch's counts go with the last release (or lease expiry) of its bookings.
-- Only every PIN_STRIDE-th block of a chain and its last one are counted (router/state/pins.py,
-- whose PIN_STRIDE this copy must equal), each standing for the blocks since the previous one.
local PIN_STRIDE = 8

-- the 1-based positions of the pinned blocks among the first n
local function pin_positions(n)
  local ds = {}
  for d = PIN_STRIDE, n, PIN_STRIDE do ds[#ds + 1] = d end
  if n % PIN_STRIDE ~= 0 then ds[#ds + 1] = n end
  return ds
end

local function pin_weight(d)
  local r = d % PIN_STRIDE
  if r == 0 then return PIN_STRIDE end
  return r
end

local function pin_fields(inst, epoch, hex, ds)
  local fields, head = {}, inst .. '\31' .. epoch .. '\31'
  for t = 1, #ds do local d = ds[t]; fields[t] = head .. string.sub(hex, 16 * d - 15, 16 * d) end
  return fields
end

local function epoch_of(S, inst)
  local cur = redis.call('HGET', S.pin, inst)
  if cur then
    local e, n = string.match(cur, '^(%d+):(%d+)$')
    if e then return e, tonumber(n) end
  end
  return nil, 0
end

-- A field whose value is longer than hash-max-ziplist-value (64 by default) keeps the pin
-- hash in Redis's hashtable encoding: while it holds fewer than hash-max-ziplist-entries
-- (512) fields Redis keeps a hash as one ziplist, where each field written or deleted
-- moves the whole list (a 512-block booking writes and its release deletes 64 fields:
-- ~1 M of the ~4.2 M instructions redis-server spent per decision and release).
local PIN_PAD = string.rep('-', 80)

-- Pin the leading blocks of hex on inst; returns (epoch, blocks pinned, of them new).
local function pin(S, inst, hex, cap)
  local nblocks = math.floor(#hex / 16)
  redis.call('HSETNX', S.pin, '\30pad', PIN_PAD)
  local epoch, distinct = epoch_of(S, inst)
  if not epoch then epoch = tostring(redis.call('HINCRBY', S.pin, '\30', 1)) end
  local ds = pin_positions(nblocks)
  local fields = pin_fields(inst, epoch, hex, ds)
  local counts = hmget_all(S.pin, fields, {})
  local writes, n, new = {}, 0, 0
  for t = 1, #ds do
    local c = tonumber(counts[t])
    if c then
      c = c + 1
    else
      local w = pin_weight(ds[t])
      if distinct + new + w > cap then break end
      c = 1
      new = new + w
    end
    writes[#writes + 1] = fields[t]
    writes[#writes + 1] = c == 1 and '1' or string.format('%d', c)  -- text: ops.lua's now_text says why
    n = ds[t]
  end
  if #writes > 0 then hset_all(S.pin, writes) end
  redis.call('HSET', S.pin, inst, epoch .. ':' .. (distinct + new))  -- kept at 0 too: it names the instance's life
  return epoch, n, new
end

-- Unpin the n leading blocks of hex a booking pinned on inst in epoch; returns how many
-- blocks of the instance's current epoch no booking holds any more, or -1 when the epoch
-- ended (the instance was dropped, its booked load with it: the leg has nothing to release).
local function unpin(S, inst, epoch, hex, n)
  local ds = pin_positions(n)
  local fields = pin_fields(inst, epoch, hex, ds)
  local counts = hmget_all(S.pin, fields, {})
  local writes, gone, freed = {}, {}, 0
  for t = 1, #ds do
    local c = tonumber(counts[t])
    if c then  -- (absent: nothing to take back, never below zero)
      if c <= 1 then
        gone[#gone + 1] = fields[t]
        freed = freed + pin_weight(ds[t])
      else
        writes[#writes + 1] = fields[t]
        writes[#writes + 1] = string.format('%d', c - 1)
      end
    end
  end
  if #writes > 0 then hset_all(S.pin, writes) end
  for i = 1, #gone, 4000 do redis.call('HDEL', S.pin, unpack(gone, i, math.min(#gone, i + 3999))) end
  local cur, distinct = epoch_of(S, inst)
  if cur ~= epoch then return -1 end
  if freed > 0 then redis.call('HSET', S.pin, inst, epoch .. ':' .. math.max(0, distinct - freed)) end
  return freed
end
