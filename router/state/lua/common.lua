-- Shared by every pd-router script. ARGV[1] is the key prefix (a Redis hash tag such as
-- "{pdr}", so all keys live in one slot); ARGV[2] is a JSON argument object.
-- Keys: P:blk:<block key>  hash instance -> residency expiry (ms), PEXPIRE'd
--       P:lru:<instance>   zset block key -> recency, capped at the instance's capacity
--       P:seq              recency sequence
--       P:loads            hash instance -> "requests:prefill:kv:transfers:transfer_bytes" booked load
--       P:bk:<booking id>  hash legs (JSON) / pfdone
--       P:leases           zset booking id -> lease expiry (ms)
local P = ARGV[1]
local A = cjson.decode(ARGV[2])

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lua numbers are doubles and '%d' wraps above 2^63: every amount is clamped to [0, 2^52]
-- (exact, and far above any real load) so no argument can corrupt the stored load, and a
-- stored value that does not parse counts as idle instead of failing every later script.
local LOAD_MAX = 4503599627370496

local function clamp(x)
  if x ~= x or x <= 0 then return 0 end  -- NaN and negatives
  if x > LOAD_MAX then return LOAD_MAX end
  return math.floor(x)
end

local function delta(x)
  if x ~= x then return 0 end
  return math.max(-LOAD_MAX, math.min(LOAD_MAX, x))
end

local function add_load(inst, req, pf, kv, tx, tb)
  local k = P .. ':loads'
  local r, p, v, t, y = 0, 0, 0, 0, 0
  local old = redis.call('HGET', k, inst)
  if old then
    local a, b, c, d, f = string.match(old, '^(%d+):(%d+):(%d+):(%d+):?(%d*)$')
    if a then
      r, p, v, t = clamp(tonumber(a)), clamp(tonumber(b)), clamp(tonumber(c)), clamp(tonumber(d))
      y = clamp(tonumber(f) or 0)
    end
  end
  r, p, v, t = clamp(r + delta(req)), clamp(p + delta(pf)), clamp(v + delta(kv)), clamp(t + delta(tx))
  y = clamp(y + delta(tb or 0))
  if r + p + v + t + y == 0 then
    redis.call('HDEL', k, inst)  -- absent means idle: instances that come and go leave nothing behind
  else
    redis.call('HSET', k, inst, string.format('%.0f:%.0f:%.0f:%.0f:%.0f', r, p, v, t, y))
  end
end

-- The (negative) prefill work a leg still has booked: none once its remote prefill finished.
local function queued_work(leg, lgdone)
  if leg.transient and lgdone == '1' then return 0 end
  return -leg.prefill_tokens
end

local function drop_booking(id)
  local bk = P .. ':bk:' .. id
  local v = redis.call('HMGET', bk, 'legs', 'pfdone', 'lgdone')
  redis.call('ZREM', P .. ':leases', id)
  if not v[1] then return 0 end
  local pending = v[2] ~= '1'
  for _, leg in ipairs(cjson.decode(v[1])) do
    if pending then
      add_load(leg.instance, -1, queued_work(leg, v[3]), -leg.kv_tokens, -leg.transfers, -(leg.transfer_bytes or 0))
    elseif not leg.transient then
      add_load(leg.instance, -1, 0, -leg.kv_tokens, 0, 0)
    end
  end
  redis.call('DEL', bk)
  return 1
end

-- Load whose owner stopped refreshing its lease (a crashed replica) disappears.
local function sweep(now)
  local ids = redis.call('ZRANGEBYSCORE', P .. ':leases', '-inf', now, 'LIMIT', 0, 256)
  for _, id in ipairs(ids) do drop_booking(id) end
  return #ids
end

-- Leading blocks of keys held by each instance. Only holders of the first key can match;
-- each one's depth is found by binary search (an instance's run of a prefix is contiguous:
-- recorded whole, evicted and expired tail first), so the cost is O(holders x log blocks).
local function lookup(insts, keys, now)
  local index = {}
  local matched = {}
  for i, inst in ipairs(insts) do index[inst] = i; matched[i] = 0 end
  local n = #keys
  if n > 0 then
    local first = redis.call('HGETALL', P .. ':blk:' .. keys[1])
    for j = 1, #first, 2 do
      local inst = first[j]
      local idx = index[inst]
      if idx and tonumber(first[j + 1]) > now then
        local lo, hi = 1, n
        while lo < hi do
          local mid = math.floor((lo + hi + 1) / 2)
          local expiry = redis.call('HGET', P .. ':blk:' .. keys[mid], inst)
          if expiry and tonumber(expiry) > now then lo = mid else hi = mid - 1 end
        end
        matched[idx] = lo
      end
    end
  end
  local loads = {}
  if #insts > 0 then
    for i = 1, #insts, 4000 do
      local part = redis.call('HMGET', P .. ':loads', unpack(insts, i, math.min(#insts, i + 3999)))
      for j = 1, #part do loads[i + j - 1] = part[j] or '' end
    end
  end
  return {matched = matched, loads = loads}
end

local function unhold(inst, members)
  for _, key in ipairs(members) do redis.call('HDEL', P .. ':blk:' .. key, inst) end
end

-- undo: {instance: [block keys]} recorded speculatively for a request that went elsewhere.
local function undo_residency(undo)
  for inst, keys in pairs(undo) do
    if #keys > 0 then
      unhold(inst, keys)
      redis.call('ZREM', P .. ':lru:' .. inst, unpack(keys))
    end
  end
end

-- Record that inst holds keys (one whole prefix). Recency is a namespace-wide sequence
-- (strictly increasing, unlike a millisecond clock); deeper blocks get lower recency so
-- capacity eviction trims a prefix from its tail, as engines do.
-- held: leading keys the lookup found on inst; while their expiry is more than half a
-- TTL away only their recency is touched, so a hot prefix costs one write per new block.
local function record(inst, keys, now, ttl_ms, cap, held)
  local n = #keys
  if n == 0 then return end
  local lru = P .. ':lru:' .. inst
  local expiry = now + ttl_ms
  held = math.min(held or 0, n)
  if held > 0 then
    local last = redis.call('HGET', P .. ':blk:' .. keys[held], inst)
    if not last or tonumber(last) < now + ttl_ms / 2 then held = 0 end
  end
  local seq = redis.call('INCR', P .. ':seq')
  local batch = {}
  for depth, key in ipairs(keys) do
    if depth > held then
      local blk = P .. ':blk:' .. key
      redis.call('HSET', blk, inst, expiry)
      redis.call('PEXPIRE', blk, ttl_ms)
    end
    batch[#batch + 1] = seq + (n - depth + 1) / (n + 1)
    batch[#batch + 1] = key
    if #batch >= 512 then redis.call('ZADD', lru, unpack(batch)); batch = {} end
  end
  if #batch > 0 then redis.call('ZADD', lru, unpack(batch)) end
  local excess = redis.call('ZCARD', lru) - cap
  if excess > 0 then
    local popped = redis.call('ZPOPMIN', lru, excess)
    local members = {}
    for j = 1, #popped, 2 do members[#members + 1] = popped[j] end
    unhold(inst, members)
  end
end

-- Book every leg and record the prompt's prefix on each leg's instance.
local function book(b, now, lease_ms, ttl_ms, caps, held)
  local bk = P .. ':bk:' .. b.id
  if redis.call('EXISTS', bk) == 1 then return 0 end
  redis.call('HSET', bk, 'legs', cjson.encode(b.legs), 'pfdone', '0')
  redis.call('ZADD', P .. ':leases', now + lease_ms, b.id)
  for _, leg in ipairs(b.legs) do
    add_load(leg.instance, 1, leg.prefill_tokens, leg.kv_tokens, leg.transfers, leg.transfer_bytes)
    record(leg.instance, b.keys, now, ttl_ms, caps[leg.instance], held and held[leg.instance])
  end
  return 1
end
