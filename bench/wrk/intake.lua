-- Google Ads lead form webhooks for `make bench`, as Google sends them: each with a lead id of its
-- own, the connector's google_key, and the same mix of new and duplicate phones as create.lua.
dofile(os.getenv("BENCH_WRK_DIR") .. "/create.lua")
local sent = 0

function init(args)
  duplicates = {}
  for phone in string.gmatch(os.getenv("BENCH_DUPLICATE_PHONES") or "", "[^,]+") do
    table.insert(duplicates, phone)
  end
  duplicate_share = tonumber(os.getenv("BENCH_DUPLICATE_SHARE") or "0.25")
  google_key = os.getenv("BENCH_GOOGLE_KEY")
  run = os.getenv("BENCH_RUN") or "0"
  math.randomseed(os.time() * 1000 + id * 7919 + math.floor(os.clock() * 1e6))
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = nil   -- senders have no token
end

local interests = {"2bhk", "3bhk", "villa", "plot"}

function request()
  local phone
  if #duplicates > 0 and math.random() < duplicate_share then
    phone = duplicates[math.random(#duplicates)]
  else
    phone = new_phone("+9197")
  end
  sent = sent + 1
  return wrk.format("POST", nil, nil, string.format(
    '{"lead_id":"bench-%s-%d-%d","api_version":"1.0","form_id":40000000000,"campaign_id":50000000000,' ..
    '"adgroup_id":60000000000,"creative_id":70000000000,"gcl_id":"bench-gclid","google_key":"%s",' ..
    '"is_test":false,"user_column_data":[' ..
    '{"column_name":"Full Name","string_value":"Bench Lead","column_id":"FULL_NAME"},' ..
    '{"column_name":"User Phone","string_value":"%s","column_id":"PHONE_NUMBER"},' ..
    '{"column_name":"Interest","string_value":"%s","column_id":"INTEREST"}]}',
    run, id, sent, google_key, phone, interests[math.random(#interests)]))
end
