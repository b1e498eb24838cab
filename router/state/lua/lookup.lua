local now = now_ms()
return cjson.encode(lookup(A.instances, A.keys, now))
