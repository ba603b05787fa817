-- wrk script for bench/datapath.py: POSTs pre-built OpenAI bodies, prints one result line.
-- usage: wrk ... -s bench/lua/datapath_post.lua URL -- BODY_FILE PATH [PAUSE_MS]
-- BODY_FILE holds one JSON body per line; requests cycle through them (formatted once, in init).
-- PAUSE_MS (optional, > 0): each connection waits that long after a response before its next request.

local requests = {}
local index = 0

function init(args)
   local file = assert(io.open(args[1], "rb"))
   local path = args[2] or "/v1/completions"
   for line in file:lines() do
      if #line > 0 then
         local headers = { ["Content-Type"] = "application/json" }
         requests[#requests + 1] = wrk.format("POST", path, headers, line)
      end
   end
   file:close()
   assert(#requests > 0, "no bodies in " .. args[1])
   local pause = tonumber(args[3] or "0")
   if pause > 0 then
      function delay()
         return pause
      end
   end
end

function request()
   index = index % #requests + 1
   return requests[index]
end

function done(summary, latency, requests_stats)
   local e = summary.errors
   io.write(string.format(
      "DATAPATH-RESULT {\"requests\":%d,\"duration_us\":%d,\"bytes\":%d," ..
      "\"p50_us\":%d,\"p90_us\":%d,\"p99_us\":%d,\"mean_us\":%.1f,\"max_us\":%d," ..
      "\"connect_errors\":%d,\"read_errors\":%d,\"write_errors\":%d,\"status_errors\":%d,\"timeouts\":%d}\n",
      summary.requests, summary.duration, summary.bytes,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max,
      e.connect, e.read, e.write, e.status, e.timeout))
end
