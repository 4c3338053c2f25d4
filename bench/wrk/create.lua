-- Creates for `make bench`: new leads (random +9197 mobiles, never in the synthetic +9198 range)
-- mixed with duplicates of existing leads' phones, over the sources and rules of the demo workspace.
dofile(os.getenv("BENCH_WRK_DIR") .. "/report.lua")
local threads = {}
local counter = 1

function setup(thread)
  thread:set("id", counter)
  table.insert(threads, thread)
  counter = counter + 1
end

function init(args)
  duplicates, sources = {}, {}
  for phone in string.gmatch(os.getenv("BENCH_DUPLICATE_PHONES") or "", "[^,]+") do
    table.insert(duplicates, phone)
  end
  for source in string.gmatch(os.getenv("BENCH_SOURCES") or "", "[^,]+") do
    table.insert(sources, source)
  end
  duplicate_share = tonumber(os.getenv("BENCH_DUPLICATE_SHARE") or "0.25")
  math.randomseed(os.time() * 1000 + id * 7919 + math.floor(os.clock() * 1e6))
  wrk.headers["Content-Type"] = "application/json"
end

local interests = {"2bhk", "3bhk", "villa", "plot"}

-- A random mobile after the prefix (+9197 here; bench/wrk/batch.lua uses another range).
function new_phone(prefix)
  return string.format("%s%04d%04d", prefix, math.random(0, 9999), math.random(0, 9999))
end

-- A create body (JSON) for the phone.
function lead_json(phone)
  return string.format(
    '{"first_name":"Bench","last_name":"Lead","phone":"%s","source":"%s","estimated_value":%d,' ..
    '"custom_fields":{"product_interest":"%s"}}',
    phone, sources[math.random(#sources)], math.random(20, 300) * 100000, interests[math.random(#interests)])
end

-- A phone of an existing lead (duplicate_share of the time), else a new one.
function pick_phone()
  if #duplicates > 0 and math.random() < duplicate_share then
    return duplicates[math.random(#duplicates)]
  end
  return new_phone("+9197")
end

function request()
  return wrk.format("POST", nil, nil, lead_json(pick_phone()))
end
