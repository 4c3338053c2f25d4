-- Google Ads lead form webhooks for `make bench`, as Google sends them: each with a lead id of its
-- own, the connector's google_key, and the same mix of new and duplicate phones as create.lua.
dofile(os.getenv("BENCH_WRK_DIR") .. "/create.lua")
local sent = 0

local create_init = init

function init(args)
  create_init(args)   -- the duplicate phones and their share, as create.lua reads them
  google_key = os.getenv("BENCH_GOOGLE_KEY")
  run = os.getenv("BENCH_RUN") or "0"
  wrk.headers["Authorization"] = nil   -- senders have no token
end

local interests = {"2bhk", "3bhk", "villa", "plot"}

function request()
  local phone = pick_phone()
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
