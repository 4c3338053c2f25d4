-- Batches for `make bench`: POST /api/v1/leads/batch with BENCH_BATCH_SIZE new leads each, the
-- bodies create.lua sends (its setup and init too), with +9196 mobiles: outside the synthetic +9198
-- and create.lua's +9197 ranges.
dofile(os.getenv("BENCH_WRK_DIR") .. "/create.lua")
local size = tonumber(os.getenv("BENCH_BATCH_SIZE") or "100")

function request()
  local items = {}
  for i = 1, size do
    items[i] = lead_json(new_phone("+9196"))
  end
  return wrk.format("POST", nil, nil, '{"leads":[' .. table.concat(items, ",") .. "]}")
end
