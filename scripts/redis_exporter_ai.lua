-- For Prometheus's redis_exporter: `redis_exporter --script scripts/redis_exporter_ai.lua` exports every numeric
-- field of this module's INFO sections (ai_queues, ai_keys, ...), which its --include-modules-metrics leaves out
-- (it keeps only the field names on its allow-list). Each comes back as redis_script_values{key="<field>"}:
-- `ai_queue_CPU_wait_p99_us` as it is, a key's `ai_model_fraud:calls=…,total_p99_us=…` as
-- `ai_model_fraud_calls`, `ai_model_fraud_total_p99_us`, ... Values are returned as strings (a Lua number would
-- lose its fraction on the way out); the exporter parses them.
local out = {}
for line in string.gmatch(redis.call('INFO', 'modules'), '[^\r\n]+') do
  local name, value = string.match(line, '^(ai_[%w_%.%-]+):(.*)$')
  if name and string.find(value, '=', 1, true) then
    for k, v in string.gmatch(value, '([%w_]+)=([^,]*)') do
      if tonumber(v) then
        out[#out + 1] = name .. '_' .. k
        out[#out + 1] = v
      end
    end
  elseif name and tonumber(value) then
    out[#out + 1] = name
    out[#out + 1] = value
  end
end
return out
