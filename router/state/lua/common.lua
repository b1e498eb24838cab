-- Shared by every pd-router script. ARGV[1] is the key prefix (a Redis hash tag such as
-- "{pdr}", so all keys live in one slot); ARGV[2] is a JSON argument object.
-- Keys: P:blk:<block key>  hash instance -> residency expiry (ms), PEXPIRE'd
--       P:lru:<instance>   zset block key -> recency, capped at the instance's capacity
--       P:seq              recency sequence
--       P:load:<instance>  hash req / pf / kv / tx booked load
--       P:bk:<booking id>  hash legs (JSON) / pfdone
--       P:leases           zset booking id -> lease expiry (ms)
local P = ARGV[1]
local A = cjson.decode(ARGV[2])

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function add_load(inst, req, pf, kv, tx)
  local k = P .. ':load:' .. inst
  local v = redis.call('HMGET', k, 'req', 'pf', 'kv', 'tx')
  redis.call('HSET', k,
    'req', math.max(0, (tonumber(v[1]) or 0) + req),
    'pf', math.max(0, (tonumber(v[2]) or 0) + pf),
    'kv', math.max(0, (tonumber(v[3]) or 0) + kv),
    'tx', math.max(0, (tonumber(v[4]) or 0) + tx))
end

local function drop_booking(id)
  local bk = P .. ':bk:' .. id
  local v = redis.call('HMGET', bk, 'legs', 'pfdone')
  redis.call('ZREM', P .. ':leases', id)
  if not v[1] then return 0 end
  local pending = v[2] ~= '1'
  for _, leg in ipairs(cjson.decode(v[1])) do
    if pending then
      add_load(leg.instance, -1, -leg.prefill_tokens, -leg.kv_tokens, -leg.transfers)
    elseif not leg.transient then
      add_load(leg.instance, -1, 0, -leg.kv_tokens, 0)
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

local function lookup(insts, keys, now)
  local alive = {}
  local matched = {}
  for i, inst in ipairs(insts) do alive[inst] = i; matched[i] = 0 end
  for depth, key in ipairs(keys) do
    local fields = redis.call('HGETALL', P .. ':blk:' .. key)
    if #fields == 0 then break end
    local next_alive = {}
    local count = 0
    for j = 1, #fields, 2 do
      local idx = alive[fields[j]]
      if idx and tonumber(fields[j + 1]) > now then
        next_alive[fields[j]] = idx
        matched[idx] = depth
        count = count + 1
      end
    end
    if count == 0 then break end
    alive = next_alive
  end
  local loads = {}
  for i, inst in ipairs(insts) do
    local v = redis.call('HMGET', P .. ':load:' .. inst, 'req', 'pf', 'kv', 'tx')
    loads[i] = {tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0}
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
local function record(inst, keys, now, ttl_ms, cap)
  local n = #keys
  if n == 0 then return end
  local lru = P .. ':lru:' .. inst
  local expiry = now + ttl_ms
  local seq = redis.call('INCR', P .. ':seq')
  local batch = {}
  for depth, key in ipairs(keys) do
    local blk = P .. ':blk:' .. key
    redis.call('HSET', blk, inst, expiry)
    redis.call('PEXPIRE', blk, ttl_ms)
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
local function book(b, now, lease_ms, ttl_ms, caps)
  local bk = P .. ':bk:' .. b.id
  if redis.call('EXISTS', bk) == 1 then return 0 end
  redis.call('HSET', bk, 'legs', cjson.encode(b.legs), 'pfdone', '0')
  redis.call('ZADD', P .. ':leases', now + lease_ms, b.id)
  for _, leg in ipairs(b.legs) do
    add_load(leg.instance, 1, leg.prefill_tokens, leg.kv_tokens, leg.transfers)
    record(leg.instance, b.keys, now, ttl_ms, caps[leg.instance])
  end
  return 1
end
