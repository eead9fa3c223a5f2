-- The post office: messages are JSON text between senders and receivers, delivered in the
-- order they were posted. It counts what passes through.
local post = {}

function post.new()
  return { queue = {}, sent = 0, bytes = 0, by_lib = { rxi = 0, dk = 0 } }
end

--- Posts `body` (JSON text written by library `lib`: "rxi" for json.lua, "dk" for dkjson) to
--- `to`: "market", or an agent id.
function post.send(office, to, body, lib)
  local q = office.queue
  q[#q + 1] = { to = to, body = body, lib = lib }
  office.sent = office.sent + 1
  office.bytes = office.bytes + #body
  office.by_lib[lib] = office.by_lib[lib] + 1
end

--- Hands every queued message to `deliver(to, body, lib)`, in posting order.
function post.flush(office, deliver)
  local q = office.queue
  office.queue = {}
  for i = 1, #q do
    local m = q[i]
    deliver(m.to, m.body, m.lib)
  end
  return #q
end

return post
