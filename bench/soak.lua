-- The soak's wrk script (bench/soak.py): each thread stops after its share of the requests and
-- counts the statuses other than 200. Arguments (after `--`): total requests, number of threads.
-- A thread that has its share says "soak: thread done" on stderr, so soak.py can end wrk at once
-- (wrk itself would sleep out its -d); done() prints "soak: responses N non200 M".

local threads = {}
local created = 0

function setup(thread)
   thread:set("index", created)
   created = created + 1
   table.insert(threads, thread)
end

function init(args)
   local total = tonumber(args[1])
   local count = tonumber(args[2])
   share = math.floor(total / count)
   if index < total % count then
      share = share + 1
   end
   responses = 0
   non200 = 0
end

function response(status, headers, body)
   -- responses that complete in the event-loop turn that stopped the thread are not counted
   if responses >= share then
      return
   end
   responses = responses + 1
   if status ~= 200 then
      non200 = non200 + 1
   end
   if responses == share then
      io.stderr:write("soak: thread done\n")
      wrk.thread:stop()
   end
end

function done(summary, latency, requests)
   local total, bad = 0, 0
   for _, thread in ipairs(threads) do
      total = total + thread:get("responses")
      bad = bad + thread:get("non200")
   end
   io.write(string.format("soak: responses %d non200 %d\n", total, bad))
end
