-- Batches for `make bench`: POST /api/v1/leads/batch with BENCH_BATCH_SIZE new leads each (random
-- +9196 mobiles, outside the synthetic +9198 and create.lua's +9197 ranges), over the demo sources.
dofile(os.getenv("BENCH_WRK_DIR") .. "/report.lua")
local counter = 1

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end

function init(args)
  sources = {}
  for source in string.gmatch(os.getenv("BENCH_SOURCES") or "", "[^,]+") do
    table.insert(sources, source)
  end
  size = tonumber(os.getenv("BENCH_BATCH_SIZE") or "100")
  math.randomseed(os.time() * 1000 + id * 7919 + math.floor(os.clock() * 1e6))
  wrk.headers["Content-Type"] = "application/json"
end

local interests = {"2bhk", "3bhk", "villa", "plot"}

function request()
  local items = {}
  for i = 1, size do
    items[i] = string.format(
      '{"first_name":"Bench","last_name":"Batch","phone":"+9196%04d%04d","source":"%s","estimated_value":%d,' ..
      '"custom_fields":{"product_interest":"%s"}}',
      math.random(0, 9999), math.random(0, 9999), sources[math.random(#sources)], math.random(20, 300) * 100000,
      interests[math.random(#interests)])
  end
  return wrk.format("POST", nil, nil, '{"leads":[' .. table.concat(items, ",") .. "]}")
end
