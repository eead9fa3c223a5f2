-- The swarm: motes drift toward the wizards' tower; a set keyed by the mote tables. Positions
-- and velocities are fresh {x, y} tables every frame.
local motes = {}

local W, H = 640, 640

function motes.spawn(state, n)
  for _ = 1, n do
    state.next_mote = state.next_mote + 1
    local edge = math.random(4)
    local x = edge == 1 and 0 or edge == 2 and W or math.random() * W
    local y = edge == 3 and 0 or edge == 4 and H or math.random() * H
    local m = { id = state.next_mote, pos = { x = x, y = y }, hp = math.random(3, 12),
      speed = 0.5 + math.random() * 1.5, glyph = string.char(96 + math.random(26)) }
    state.motes[m] = true
    state.count = state.count + 1
  end
end

--- Moves every mote toward the tower at the centre; those that arrive breach it.
function motes.advance(state)
  local cx, cy = W / 2, H / 2
  for m in pairs(state.motes) do
    local dx, dy = cx - m.pos.x, cy - m.pos.y
    local d = math.sqrt(dx * dx + dy * dy)
    if d < 8 then
      state.breaches = state.breaches + 1
      state.motes[m] = nil
      state.count = state.count - 1
    else
      m.vel = { x = dx / d * m.speed, y = dy / d * m.speed }
      m.pos = { x = m.pos.x + m.vel.x, y = m.pos.y + m.vel.y }
    end
  end
end

--- The first mote the set yields within `r` of (x, y), or nil.
function motes.first_near(state, x, y, r)
  local r2 = r * r
  for m in pairs(state.motes) do
    local dx, dy = m.pos.x - x, m.pos.y - y
    if dx * dx + dy * dy <= r2 then return m end
  end
  return nil
end

motes.W, motes.H = W, H
return motes
