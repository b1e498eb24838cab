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
-- pinning booking and ended when the instance is dropped ('F' with drop_load); a block's field
-- lives under its epoch, so a booking from before a drop releases into its own (ended) epoch
-- and never touches the counts or the load of the instance's next life. Bounded: at most cap
-- distinct blocks per epoch (a booking pins its leading blocks and stops at the first new one
-- beyond the cap; the rest is booked as its own KV), one epoch field per instance, and an
-- ended epoch's fields go with the last release (or lease expiry) of its bookings.
-- Only a chain's blocks at grid positions and its last one are counted (router/state/pins.py,
-- whose PIN_STRIDE, PIN_FINE and PIN_PER_OCTAVE these copies must equal), each standing for the
-- blocks since the previous one: every PIN_STRIDE-th block up to PIN_FINE, then PIN_PER_OCTAVE
-- per doubling of the position (a 2,048-block chain: 80 keys).
-- The union of the pinned chains is prefix-closed (block keys are chained: a key stands for its
-- whole prefix), so it is kept as the tree it is, as pins.py's PinCounts keeps it: one field per
-- key in the union, valued children * KIDS + ends (how many of its children are in the union,
-- how many bookings' pinned chains end at it). A booking writes only the keys it is the first
-- to pin (found by bisecting the prefix already held) and one count; a release, only the keys
-- it frees. (Counting holders per key instead wrote every key of the chain at each booking and
-- release: a 2,048-block prompt held by bookings in flight cost 256 reads and 256 writes a time.)
local PIN_STRIDE = 8
local PIN_FINE = 256
local PIN_PER_OCTAVE = 16
local FINE_KEYS = PIN_FINE / PIN_STRIDE
local KIDS = 67108864  -- 2^26: more bookings in flight than this never end at one key
local KIDS_TEXT, LESS_KIDS = '67108864', '-67108864'

-- How many grid positions are at most p; the t-th grid position (1-based).
local function grid_count(p)
  if p <= PIN_FINE then return math.floor(math.max(p, 0) / PIN_STRIDE) end
  local count, lo = FINE_KEYS, PIN_FINE
  while p >= 2 * lo do count = count + PIN_PER_OCTAVE; lo = 2 * lo end
  return count + math.floor((p - lo) / (lo / PIN_PER_OCTAVE))
end

local function grid_pos(t)
  if t <= FINE_KEYS then return t * PIN_STRIDE end
  local lo = PIN_FINE
  t = t - FINE_KEYS
  while t > PIN_PER_OCTAVE do t = t - PIN_PER_OCTAVE; lo = 2 * lo end
  return lo + t * (lo / PIN_PER_OCTAVE)
end

-- How many keys of a chain of n blocks are pinned: its grid positions, and its last block.
local function pin_count(n)
  local g = grid_count(n)
  if n > 0 and grid_pos(g) ~= n then return g + 1 end
  return g
end

-- The pinned key t (1-based) of a chain of n blocks keyed by hex: its block position, field.
local function pin_pos(t, n)
  return math.min(grid_pos(t), n)
end

local function pin_field(head, hex, t, n)
  local d = pin_pos(t, n)
  return head .. string.sub(hex, 16 * d - 15, 16 * d)
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

-- A field of the loads hash that is no instance: its long value (PIN_PAD too) keeps the hash in
-- Redis's hashtable encoding. Below 512 fields Redis keeps a hash as one ziplist, which every
-- HGET/HMGET/HSET scans from its head: with 256 instances a shard (1,024 over 4 shards), the
-- loads a decision reads and books scanned ~800 k instructions of ziplist, 14% of the decision.
local LOADS_PAD = '\30pad'

-- Pin the leading blocks of hex on inst; returns (epoch, blocks pinned, of them new).
local function pin(S, inst, hex, cap)
  local nblocks = math.floor(#hex / 16)
  redis.call('HSETNX', S.pin, '\30pad', PIN_PAD)
  local epoch, distinct = epoch_of(S, inst)
  if not epoch then epoch = tostring(redis.call('HINCRBY', S.pin, '\30', 1)) end
  local head = inst .. '\31' .. epoch .. '\31'
  local chain = pin_count(nblocks)
  local held = 0  -- leading keys of the chain in the union already (a prefix of it: bisected)
  if chain > 0 and redis.call('HEXISTS', S.pin, pin_field(head, hex, 1, nblocks)) == 1 then
    held = chain
    if redis.call('HEXISTS', S.pin, pin_field(head, hex, chain, nblocks)) == 0 then
      local lo, hi = 1, chain - 1
      while lo < hi do
        local mid = math.floor((lo + hi + 1) / 2)
        if redis.call('HEXISTS', S.pin, pin_field(head, hex, mid, nblocks)) == 1 then lo = mid else hi = mid - 1 end
      end
      held = lo
    end
  end
  local covered_held = held > 0 and pin_pos(held, nblocks) or 0
  local reach = covered_held + math.max(cap - distinct, 0)
  local m = chain
  if reach < nblocks then m = math.max(held, grid_count(reach)) end
  if m == 0 then
    redis.call('HSET', S.pin, inst, epoch .. ':' .. distinct)  -- kept at 0 too: it names the instance's life
    return epoch, 0, 0
  end
  local new = pin_pos(m, nblocks) - covered_held
  if m > held then
    if held > 0 then redis.call('HINCRBY', S.pin, pin_field(head, hex, held, nblocks), KIDS_TEXT) end
    local writes = {}
    for t = held + 1, m - 1 do
      writes[#writes + 1] = pin_field(head, hex, t, nblocks)
      writes[#writes + 1] = KIDS_TEXT
    end
    writes[#writes + 1] = pin_field(head, hex, m, nblocks)
    writes[#writes + 1] = '1'
    hset_all(S.pin, writes)
  else
    redis.call('HINCRBY', S.pin, pin_field(head, hex, m, nblocks), '1')
  end
  redis.call('HSET', S.pin, inst, epoch .. ':' .. (distinct + new))
  return epoch, pin_pos(m, nblocks), new
end

-- Unpin the n leading blocks of hex a booking pinned on inst in epoch; returns how many
-- blocks of the instance's current epoch no booking holds any more, or -1 when the epoch
-- ended (the instance was dropped, its booked load with it: the leg has nothing to release).
local function unpin(S, inst, epoch, hex, n)
  local freed = 0
  local chain = pin_count(n)
  if chain > 0 then
    local head = inst .. '\31' .. epoch .. '\31'
    local last = pin_field(head, hex, chain, n)
    local v = tonumber(redis.call('HGET', S.pin, last))
    if v and v % KIDS > 0 then  -- (no chain ends there: not pinned, e.g. released already)
      if v > 1 then  -- other chains end there too, or go on from it: it stays
        redis.call('HINCRBY', S.pin, last, '-1')
      else
        -- it goes, and each parent that nothing else holds: read 8 of them, then the rest
        local gone, j, batch = {last}, chain, 8
        while j > 1 do
          local fields = {}
          for t = j - 1, math.max(1, j - batch), -1 do fields[#fields + 1] = pin_field(head, hex, t, n) end
          local values = redis.call('HMGET', S.pin, unpack(fields))
          local stays = false
          for i = 1, #fields do
            local pv = tonumber(values[i]) or 0
            local kids, ends = math.floor(pv / KIDS), pv % KIDS
            if kids > 1 or ends > 0 then
              if kids > 0 then redis.call('HINCRBY', S.pin, fields[i], LESS_KIDS) end
              stays = true
              break
            end
            gone[#gone + 1] = fields[i]
            j = j - 1
          end
          if stays then break end
          batch = 4000
        end
        for i = 1, #gone, 4000 do redis.call('HDEL', S.pin, unpack(gone, i, math.min(#gone, i + 3999))) end
        freed = n - (j > 1 and pin_pos(j - 1, n) or 0)
      end
    end
  end
  local cur, distinct = epoch_of(S, inst)
  if cur ~= epoch then return -1 end
  if freed > 0 then redis.call('HSET', S.pin, inst, epoch .. ':' .. math.max(0, distinct - freed)) end
  return freed
end
