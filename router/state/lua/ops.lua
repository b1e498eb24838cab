-- Every pd-router state operation, in one script. A call carries a list of ops; each op
-- reads its declared keys from KEYS and its plain string arguments from ARGV, in order:
--   ARGV = op, nkeys, nargs, arg..., op, nkeys, nargs, arg..., ...   (no JSON anywhere)
-- Each op touches the keys of one shard (one hash tag, so one Cluster slot). The store
-- sends the ops of one decision in one call to a standalone Redis and in one call per
-- slot, pipelined, to a Cluster (router/state/redis_layout.py describes the key layout).
-- The reply is one entry per op, in order. pins.lua (sent in front of this file) holds the
-- batched hash helpers and the pinned-block counts.
--
-- Residency shard {P:r<n>} (prompts whose first block key is n modulo the shard count):
--   :b:<block key>  hash instance -> time the instance was last recorded holding it (ms); the key in 16 hex digits
--   :fg             hash instance -> time its residency was last forgotten (ms)
-- Instance shard {P:i<n>} (instances whose name hashes to n):
--   :loads          hash instance -> "requests:prefill:kv:transfers:transfer_bytes", then "|<replica id>=<its share>"
--                   per router replica with load there (add_load); \30pad -> a long value (LOADS_PAD)
--   :lz             zset instance -> load key (prefill + requests x request_tokens), loaded only
--   :bk             hash booking id -> flag ('0' booked, '2' remote prefill done, '1' first byte) + the booking
--                   replica's id + \28 + this shard's legs (\30 between legs, \31 between fields)
--                   [+ \29 + the prompt's block keys, 16 hex digits each, when a leg pins them]
--   :leases         zset booking id -> lease expiry (ms)
--   :pin            hash of the blocks pinned by bookings in flight (router/state/pins.py): <inst> -> "<epoch>:<distinct
--                   blocks pinned>"; <inst>\31<epoch>\31<block hex> -> bookings in flight holding it; \30 -> epoch sequence; \30pad -> a long value (keeps the hash out of the ziplist encoding: pins.lua)
--   :lru:<inst>     zset "<residency shard>:<block key, 16 hex digits>" -> recency, capped at the capacity
--   :seq            recency sequence

local NOW, NOW_TEXT
local function now_ms()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return NOW
end

-- A Lua number handed to redis.call is formatted with snprintf('%.17g') (~2,300 instructions
-- each; a 2,048-block prompt's records wrote 4,096 of them), so integers go as text: '%d'
-- (exact below 2^53, as every integer here is).
local function now_text()
  if not NOW_TEXT then NOW_TEXT = string.format('%d', now_ms()) end
  return NOW_TEXT
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
  x = tonumber(x) or 0
  if x ~= x then return 0 end
  return math.max(-LOAD_MAX, math.min(LOAD_MAX, x))
end

-- A stored load "r:p:k:t:b" moved by the deltas, clamped; '' when it is idle (absent means idle).
local function moved(old, req, pf, kv, tx, tb)
  local r, p, v, t, y = 0, 0, 0, 0, 0
  if old then
    local a, b, c, d, f = string.match(old, '^(%d+):(%d+):(%d+):(%d+):?(%d*)$')
    if a then
      r, p, v, t = clamp(tonumber(a)), clamp(tonumber(b)), clamp(tonumber(c)), clamp(tonumber(d))
      y = clamp(tonumber(f) or 0)
    end
  end
  r, p, v, t = clamp(r + delta(req)), clamp(p + delta(pf)), clamp(v + delta(kv)), clamp(t + delta(tx))
  y = clamp(y + delta(tb))
  if r + p + v + t + y == 0 then return '', 0, 0 end
  return string.format('%d:%d:%d:%d:%d', r, p, v, t, y), r, p  -- clamped: exact
end

-- Move an instance's booked load, and (rep: the booking replica's id) that replica's share of
-- it, carried in the same value: "<total>|<rep>=<share>|<rep>=<share>...", one segment per
-- replica with load there (same format, KV left out: always 0, since booked KV is the union
-- of the blocks pinned by every replica's bookings, which no share can be taken out of). A
-- replica reads the value and tells the other replicas' load from its own, which it knows
-- before Redis does (redis_store.py); in one field, the share costs no command of its own.
local function add_load(S, inst, req, pf, kv, tx, tb, rep)
  local old = redis.call('HGET', S.loads, inst)
  local head, tail = old, ''
  if old then
    local bar = string.find(old, '|', 1, true)
    if bar then head, tail = string.sub(old, 1, bar - 1), string.sub(old, bar) end
  end
  local packed, r, p = moved(head, req, pf, kv, tx, tb)
  if packed == '' then
    redis.call('HDEL', S.loads, inst)  -- absent means idle (shares with it): instances that come and go leave nothing behind
    redis.call('ZREM', S.lz, inst)
    return
  end
  if rep and rep ~= '' then
    local key = '|' .. rep .. '='
    local at = string.find(tail, key, 1, true)
    local mine = nil
    if at then
      local after = string.find(tail, '|', at + 1, true)
      mine = string.sub(tail, at + #key, after and after - 1 or -1)
      tail = string.sub(tail, 1, at - 1) .. (after and string.sub(tail, after) or '')
    end
    mine = moved(mine, req, pf, 0, tx, tb)
    if mine ~= '' then tail = tail .. key .. mine end
  end
  redis.call('HSET', S.loads, inst, packed .. tail)
  redis.call('ZADD', S.lz, p + r * S.rt, inst)
end

-- A booking's legs: {inst, prefill, kv, transfers, transfer_bytes, transient, block tokens,
-- pin epoch, blocks pinned}, the block keys (hex) its pinning legs pinned, and the id of the
-- replica that booked it ('' for a booking written before replicas were told apart).
local function legs_of(packed)
  local legs = {}
  local cut = string.find(packed, '\29', 2, true)
  local body = cut and string.sub(packed, 2, cut - 1) or string.sub(packed, 2)
  local rep = ''
  local r = string.find(body, '\28', 1, true)
  if r then rep, body = string.sub(body, 1, r - 1), string.sub(body, r + 1) end
  for leg in string.gmatch(body, '[^\30]+') do
    local f = {}
    for x in string.gmatch(leg, '[^\31]+') do f[#f + 1] = x end
    legs[#legs + 1] = {f[1], tonumber(f[2]) or 0, tonumber(f[3]) or 0, tonumber(f[4]) or 0, tonumber(f[5]) or 0, f[6] == '1',
                       tonumber(f[7]) or 0, f[8] or '', tonumber(f[9]) or 0}
  end
  local flag = string.sub(packed, 1, 1)
  return flag == '1', legs, flag == '2', cut and string.sub(packed, cut + 1) or '', rep
end

-- The (negative) prefill work a leg still has booked: none for a remote prefill leg whose
-- prefill finished (flag '2': its leg answered, the first byte has not arrived yet).
local function queued_work(l, leg_done)
  if l[6] and leg_done then return 0 end
  return -l[2]
end

local function drop(S, id)
  redis.call('ZREM', S.leases, id)
  local packed = redis.call('HGET', S.bk, id)
  if not packed then return 0 end
  local done, legs, leg_done, hex, rep = legs_of(packed)
  for _, l in ipairs(legs) do
    local kv, freed = l[3], 0
    if l[7] > 0 then
      freed = unpin(S, l[1], l[8], hex, l[9])
      kv = kv + math.max(0, freed) * l[7]
    end
    if freed < 0 then  -- pinned in a life of the instance that ended with it: nothing booked to release
    elseif not done then
      add_load(S, l[1], -1, queued_work(l, leg_done), -kv, -l[4], -l[5], rep)
    elseif not l[6] then
      add_load(S, l[1], -1, 0, -kv, 0, 0, rep)
    end
  end
  redis.call('HDEL', S.bk, id)
  return 1
end

-- The remote prefill leg answered: its prefill work stops queueing on the prefill instance;
-- the transfer and the rest stay booked until the first byte. Booking flag '0' -> '2'.
local function prefill_leg_done(S, id)
  local packed = redis.call('HGET', S.bk, id)
  if not packed or string.sub(packed, 1, 1) ~= '0' then return 0 end
  redis.call('HSET', S.bk, id, '2' .. string.sub(packed, 2))
  local _, legs, _, _, rep = legs_of(packed)
  for _, l in ipairs(legs) do
    if l[6] then add_load(S, l[1], 0, -l[2], 0, 0, 0, rep) end
  end
  return 1
end

local function prefill_done(S, id)
  local packed = redis.call('HGET', S.bk, id)
  if not packed or string.sub(packed, 1, 1) == '1' then return 0 end
  redis.call('HSET', S.bk, id, '1' .. string.sub(packed, 2))
  local _, legs, leg_done, _, rep = legs_of(packed)
  for _, l in ipairs(legs) do
    if l[6] then  -- a remote prefill leg: wholly released at the first byte
      add_load(S, l[1], -1, queued_work(l, leg_done), -l[3], -l[4], -l[5], rep)
    else
      add_load(S, l[1], 0, -l[2], 0, -l[4], -l[5], rep)
    end
  end
  return 1
end

-- Load whose owner stopped refreshing its lease (a crashed replica) disappears. Swept by
-- every replica's lease refresh ('T', every lease/3 on every shard), not on each decision:
-- a decision then costs one command less per shard it reads.
local function sweep(S)
  local ids = redis.call('ZRANGEBYSCORE', S.leases, '-inf', now_ms(), 'LIMIT', 0, 256)
  for _, id in ipairs(ids) do drop(S, id) end
end

local function shard(k0, rt)
  return {loads = KEYS[k0], lz = KEYS[k0 + 1], bk = KEYS[k0 + 2], leases = KEYS[k0 + 3], pin = KEYS[k0 + 4],
          rt = tonumber(rt) or 0}
end

-- Record that inst holds a prompt's blocks block(1 .. n) (one whole prefix). held:
-- leading blocks the lookup found; while the last of them was recorded less than half a
-- TTL ago only the blocks beyond them are written, so a hot prefix costs one write per new block.
-- ttl_text: the TTL as the argument gave it (text: now_text).
local function record(block, n, inst, now, ttl, ttl_text, held)
  if held > 0 then
    local last = redis.call('HGET', block(held), inst)
    if not last or tonumber(last) < now - ttl / 2 then held = 0 end
  end
  local stamp = now_text()
  for d = held + 1, n do
    local key = block(d)
    redis.call('HSET', key, inst, stamp)
    redis.call('PEXPIRE', key, ttl_text)
  end
end

-- 'L' (residency shard): leading blocks held by every holder of the first block, then
-- record the prompt on the booked instances. KEYS fg, b:<k1>..b:<kn>; ARGV ttl, '', m,
-- inst x m. Or, on a standalone Redis (which never checks a script's keys), KEYS fg alone
-- and ARGV ttl, the block keys as 16 hex digits each, m, inst x m: the script names only
-- the blocks it touches (tag:b:<hex>, the same names), instead of the router sending every one.
-- Reply: instance, depth, ... over the holders (before this op's own records). Only holders
-- of the first block can match; each one's depth is a binary search (a run is contiguous:
-- recorded whole, evicted and expired tail first), so the cost is O(holders x log blocks).
local LOOKUP_HEX = ''  -- the block keys the last look-up of this call got (op_book's '=')

local function op_lookup(k0, nk, a0)
  local n, block = nk - 1, nil
  local ttl, hex = tonumber(ARGV[a0]), ARGV[a0 + 1]
  if n == 0 and #hex > 0 then
    LOOKUP_HEX = hex
    n = math.floor(#hex / 16)
    local head = string.sub(KEYS[k0], 1, -3) .. 'b:'  -- KEYS[k0] is <tag>:fg
    block = function(d) return head .. string.sub(hex, 16 * d - 15, 16 * d) end
  else
    block = function(d) return KEYS[k0 + d] end
  end
  local now = now_ms()
  local out, depth = {}, {}
  if n > 0 then
    local first = redis.call('HGETALL', block(1))
    local insts = {}
    for j = 1, #first, 2 do insts[#insts + 1] = first[j] end
    local forgot = hmget_all(KEYS[k0], insts, {})
    for j, inst in ipairs(insts) do
      local floor_t = math.max(now - ttl, tonumber(forgot[j]) or -1)  -- valid: recorded after it
      if tonumber(first[2 * j]) > floor_t then
        local lo, hi = 1, n
        while lo < hi do
          local mid = math.floor((lo + hi + 1) / 2)
          local t = redis.call('HGET', block(mid), inst)
          if t and tonumber(t) > floor_t then lo = mid else hi = mid - 1 end
        end
        depth[inst] = lo
        out[#out + 1] = inst
        out[#out + 1] = lo
      end
    end
  end
  for i = 1, tonumber(ARGV[a0 + 2]) do
    local inst = ARGV[a0 + 2 + i]
    record(block, n, inst, now, ttl, ARGV[a0], depth[inst] or 0)
  end
  return out
end

-- 'U' (residency shard): take back blocks. KEYS b:<k>...; ARGV one instance per key.
local function op_unhold(k0, nk, a0)
  for j = 0, nk - 1 do redis.call('HDEL', KEYS[k0 + j], ARGV[a0 + j]) end
  return nk
end

-- 'G' (residency shard): forget an instance's residency here. KEYS fg; ARGV inst, ttl.
-- Entries recorded before now stop counting (they expire with their hash); marks older
-- than the TTL are dropped, since everything recorded before them has expired anyway.
local function op_forget_mark(k0, nk, a0)
  local now = now_ms()
  local marks = redis.call('HGETALL', KEYS[k0])
  for j = 1, #marks, 2 do
    if tonumber(marks[j + 1]) < now - tonumber(ARGV[a0 + 1]) then redis.call('HDEL', KEYS[k0], marks[j]) end
  end
  redis.call('HSET', KEYS[k0], ARGV[a0], now_text())
  return 1
end

-- Put a prompt's blocks on an instance's LRU (deeper blocks get lower recency, so capacity
-- eviction trims a prefix from its tail, as engines do); evicted members go to out (inst,
-- member). member(d) names block d. Blocks already held (a leading run, found by binary
-- search) whose deepest one is still in the younger half of the LRU keep their recency:
-- they are at least cap/2 insertions from eviction, so only the new blocks are written (a
-- hot prefix costs O(log n + new blocks), not O(n)). A run that has aged past the middle
-- is touched whole again. (The price: new blocks can be younger than the held run before
-- them; a run left cold for cap/2 insertions is then evicted head-run-first.)
local function remember(lru, seq, member, n, cap, inst, out)
  local held = 0
  if n > 16 and redis.call('ZSCORE', lru, member(1)) then  -- (a short prompt is cheaper to rewrite whole)
    local lo, hi = 1, n
    while lo < hi do
      local mid = math.floor((lo + hi + 1) / 2)
      if redis.call('ZSCORE', lru, member(mid)) then lo = mid else hi = mid - 1 end
    end
    local rank = redis.call('ZREVRANK', lru, member(lo))
    if rank and rank < cap / 2 then held = lo end
  end
  if held >= n then return end
  local s = redis.call('INCR', seq)
  local batch = {}
  for d = held + 1, n do
    batch[#batch + 1] = s + (n - d + 1) / (n + 1)
    batch[#batch + 1] = member(d)
    if #batch >= 512 then redis.call('ZADD', lru, unpack(batch)); batch = {} end
  end
  if #batch > 0 then redis.call('ZADD', lru, unpack(batch)) end
  local excess = redis.call('ZCARD', lru) - cap
  if excess > 0 then
    local popped = redis.call('ZPOPMIN', lru, excess)
    for j = 1, #popped, 2 do out[#out + 1] = inst; out[#out + 1] = popped[j] end
  end
end

-- 'B' (instance shard): loads of some instances and the least-loaded few, then book this
-- shard's legs of a booking (nlegs may be 0: a read). KEYS loads, lz, bk, leases, pin, seq,
-- lru x nlegs; ARGV id, lease_ms, request_tokens, nread, inst x nread, nlow, nlegs,
-- (inst, prefill, kv, transfers, transfer_bytes, transient, cap, block tokens) x nlegs, the prompt's
-- residency shard, its block keys as one argument of 16 hex digits each, or '=': those the
-- look-up before it in the same call got (a standalone Redis's one call sends them once; one argument
-- instead of one per block halves what the router packs per decision, and the fixed width
-- lets the script read block d without parsing the others); LRU members are "<shard>:<hex>".
-- Then the booking replica's id ('' for none). Reply: {loads of the read instances (each
-- replica's share with them: add_load), {inst, load} of the nlow least loaded, {inst, evicted
-- member, ...}, 1 if booked now}; loads are read before this booking.
local function op_book(k0, nk, a0)
  local S = shard(k0, ARGV[a0 + 2])
  local id, lease_ms = ARGV[a0], tonumber(ARGV[a0 + 1])
  local a = a0 + 3
  local nread = tonumber(ARGV[a])
  local nlow, nlegs = tonumber(ARGV[a + nread + 1]), tonumber(ARGV[a + nread + 2])
  local rep = ARGV[a + nread + 3 + 8 * nlegs + 2] or ''
  local read = {}
  for i = 1, nread do read[i] = ARGV[a + i] end
  a = a + nread + 1
  local loads = hmget_all(S.loads, read, {})
  local low = {}
  if nlow > 0 then
    local ids = redis.call('ZRANGE', S.lz, 0, nlow - 1)
    if #ids > 0 then
      local packed = redis.call('HMGET', S.loads, unpack(ids))
      for j = 1, #ids do low[#low + 1] = ids[j]; low[#low + 1] = packed[j] or '' end
    end
  end
  a = a + 2
  local mem0 = a + 8 * nlegs
  local evicted, booked = {}, 0
  if nlegs > 0 and redis.call('HEXISTS', S.bk, id) == 0 then
    redis.call('HSETNX', S.loads, LOADS_PAD, PIN_PAD)  -- (hashtable encoding: pins.lua's LOADS_PAD)
    local prefix, hex = ARGV[mem0] .. ':', ARGV[mem0 + 1]
    if hex == '=' then hex = LOOKUP_HEX end
    local nblocks = math.floor(#hex / 16)
    local function member(d) return prefix .. string.sub(hex, 16 * d - 15, 16 * d) end
    booked = 1
    local parts, pinned = {}, false
    for i = 0, nlegs - 1 do
      local b = a + 8 * i
      local inst = ARGV[b]
      local bt, kv = clamp(tonumber(ARGV[b + 7]) or 0), clamp(tonumber(ARGV[b + 2]) or 0)
      local fields = {inst, ARGV[b + 1], kv, ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]}
      local added = kv
      if bt > 0 and nblocks > 0 and ARGV[b + 5] ~= '1' then
        local epoch, n, new = pin(S, inst, hex, tonumber(ARGV[b + 6]) or 0)
        -- the leg's own KV now includes the blocks the cap left unpinned; it adds the new blocks too
        fields[3] = string.format('%d', clamp(kv + (nblocks - n) * bt))
        fields[7], fields[8], fields[9] = bt, epoch, n
        added = kv + (nblocks - n + new) * bt
        pinned = true
      end
      parts[#parts + 1] = table.concat(fields, '\31')
      add_load(S, inst, 1, ARGV[b + 1], added, ARGV[b + 3], ARGV[b + 4], rep)
      if nblocks > 0 then remember(KEYS[k0 + 6 + i], KEYS[k0 + 5], member, nblocks, tonumber(ARGV[b + 6]), inst, evicted) end
    end
    redis.call('HSET', S.bk, id, '0' .. rep .. '\28' .. table.concat(parts, '\30') .. (pinned and ('\29' .. hex) or ''))
    redis.call('ZADD', S.leases, now_ms() + lease_ms, id)
  end
  return {loads, low, evicted, booked}
end

-- 'W' (instance shard): writes that need no answer. KEYS loads, lz, bk, leases; ARGV
-- request_tokens, then (op, booking id) pairs: 'L' remote prefill leg done, 'P' prefill done
-- (first byte), 'R' release.
local function op_writes(k0, nk, a0, na)
  local S = shard(k0, ARGV[a0])
  local applied = 0
  for i = a0 + 1, a0 + na - 1, 2 do
    if ARGV[i] == 'P' then applied = applied + prefill_done(S, ARGV[i + 1])
    elseif ARGV[i] == 'L' then applied = applied + prefill_leg_done(S, ARGV[i + 1])
    elseif ARGV[i] == 'R' then applied = applied + drop(S, ARGV[i + 1]) end
  end
  return applied
end

-- 'T' (instance shard): extend the leases of bookings alive in a replica; sweep expired
-- ones. KEYS loads, lz, bk, leases; ARGV lease_ms, request_tokens, id...
local function op_refresh(k0, nk, a0, na)
  local S = shard(k0, ARGV[a0 + 1])
  local expiry = string.format('%d', now_ms() + tonumber(ARGV[a0]))  -- text: now_text says why
  local kept, batch = 0, {'XX', 'CH'}  -- one ZADD per 2,000 bookings, not one each
  for i = a0 + 2, a0 + na - 1 do
    batch[#batch + 1] = expiry
    batch[#batch + 1] = ARGV[i]
    if #batch >= 4002 then kept = kept + redis.call('ZADD', S.leases, unpack(batch)); batch = {'XX', 'CH'} end
  end
  if #batch > 2 then kept = kept + redis.call('ZADD', S.leases, unpack(batch)) end
  sweep(S)
  return kept
end

-- 'Z' (instance shard): take members off an instance's LRU. KEYS lru; ARGV members.
local function op_unremember(k0, nk, a0, na)
  for i = a0, a0 + na - 1, 4000 do redis.call('ZREM', KEYS[k0], unpack(ARGV, i, math.min(a0 + na - 1, i + 3999))) end
  return na
end

-- 'F' (instance shard): drop an instance's LRU, and with drop_load its booked load (every
-- replica's share with it) and its pin epoch (bookings still in flight release into the
-- ended one). KEYS lru, loads, lz, pin; ARGV inst, drop_load (0/1).
local function op_forget(k0, nk, a0)
  local size = redis.call('ZCARD', KEYS[k0])
  redis.call('DEL', KEYS[k0])
  if ARGV[a0 + 1] == '1' then
    redis.call('HDEL', KEYS[k0 + 1], ARGV[a0])
    redis.call('ZREM', KEYS[k0 + 2], ARGV[a0])
    redis.call('HDEL', KEYS[k0 + 3], ARGV[a0])
  end
  return size
end

local OPS = {L = op_lookup, U = op_unhold, G = op_forget_mark, B = op_book, W = op_writes, T = op_refresh,
             Z = op_unremember, F = op_forget}
local replies = {}
local k, a = 1, 1
while a <= #ARGV do
  local op, nk, na = OPS[ARGV[a]], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if not op then return redis.error_reply('pd-router: unknown op ' .. tostring(ARGV[a])) end
  replies[#replies + 1] = op(k, nk, a + 3, na)
  k, a = k + nk, a + 3 + na
end
return replies
