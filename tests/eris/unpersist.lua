-- Eris's own test suite (fnuecke/eris, test/unpersist.lua, branch master-lua5.3), ported to
-- Lua 5.5 and luasnap; see tests/eris/persist.lua for the port notes. This runs in a process
-- that never ran persist.lua: every function in a save must come from the save itself.
--
-- Prints one line per case, "CASE <name> PASSED" or "CASE <name> FAILED <why>", for
-- tests/eris_suite.rs to read.

local dir = ...

permtable = { 1234 }

local function testcounter(counter)
  local a = counter.cur()
  counter.inc()
  return counter.cur() == a + 1
end

local function testuvinthread(func)
  local success, result = coroutine.resume(func)
  return success and result == 5
end

local function resumes(co, ...)
  local want = table.pack(...)
  local got = table.pack(coroutine.resume(co))
  if got.n ~= want.n then return false end
  for i = 1, want.n do
    if got[i] ~= want[i] then return false end
  end
  return true
end

-- name -> check(value): true when the loaded value behaves as the saved one did.
local checks = {
  { "testperm", function(v) return v == permtable end },
  { "testnil", function(v) return v == nil end },
  { "testfalse", function(v) return v == false end },
  { "testtrue", function(v) return v == true end },
  { "testludata", function(v) return type(v.ud) == "userdata" and string.format("%p", v.ud) == v.addr end },
  { "testseven", function(v) return v == 7 end },
  { "testint", function(v)
    return v == ((0xFFFFFFFF ~= -1) and (0xFFFFFFFF00000000 | 0x00000000FFFFFFFF) or (0xFFFF0000 | 0x0000FFFF))
  end },
  { "testfoobar", function(v) return v == "foobar" end },
  { "testtbl", function(v) return v.a == 2 and v[2] == 4 end },
  { "testnan", function(v) return v[1] ~= v[1] end },
  { "testlooptable", function(v) return v.testloopb.testloopa == v end },
  { "testmt", function(v) return v() == 21 end },
  { "testniinmt", function(v) return v.a == 3 end },
  { "testliteraludata", function(v) return unboxinteger(v) == 71 end },
  { "testfuncreturnsfour", function(v) return v() == 4 end },
  { "testclosure", function(v) return v() == 11 end },
  { "testfenv", function(v) return v() == 456 end },
  { "testnilclosure", function(v) return v() == nil end },
  { "testnest", function(v) return v(1) == 6 end },
  { "testuvcycle", function(v) return v()[1] == v()[2] end },
  { "testsptable", function(v) return v.a == 6 end },
  { "testspudata", function(v) return unboxboolean(v[1]) == true and unboxboolean(v[2]) == false end },
  { "testsharedref", function(v) return v[1] ~= v[2] and v[1].sharedref == v[2].sharedref end },
  { "testsharedupval", function(v) return testcounter(v) end },
  { "testdebuginfo", function(v) return (v(2)) == "foo" end },
  { "testnthread", function(v) return resumes(v, true, 4) end },
  { "testthread", function(v) return resumes(v, true, 14) end },
  { "testdthread", function(v) return coroutine.resume(v) == false end },
  { "testuvinthread", function(v) return testuvinthread(v) end },
  { "testprotthr", function(v) return resumes(v, true, "test") end },
  { "testxprotthr", function(v) return resumes(v, true, "handler:test") end },
  { "testymtthr", function(v) return resumes(v, true, true) end },
  { "testdeep", function(v) return v() == 100 end },
  { "testtail", function(v) return v() == 100 end },

  -- luasnap additions
  { "test55numbers", function(v)
    local want = { 3, 3.0, -0.0, 1/0, -1/0, math.mininteger, math.maxinteger, 2^53 + 1, 0x7ff }
    for i = 1, #want do
      if math.type(v[i]) ~= math.type(want[i]) or v[i] ~= want[i] then return false end
    end
    return 1 / v[3] == -1/0
  end },
  { "test55const", function(v)
    local a, b = v()
    return a == "const table" and b == 42
  end },
  { "test55close", function(v)
    -- closing a suspended coroutine runs its pending __close once, with no error
    local ok = coroutine.close(v.co1)
    local closed1 = ok and #v.log1 == 1 and v.log1[1] == "a:nil"
    -- running to the end runs it once too
    local ran = resumes(v.co2, true, "done") and #v.log2 == 1 and v.log2[1] == "b:nil"
    return closed1 and ran
  end },
  { "test55closeerror", function(v)
    -- As in stock Lua, an error leaves the variables pending until coroutine.close, which
    -- closes them with the error object and returns it.
    local ok, err = coroutine.resume(v.co1, "fail")
    local pending = not ok and err == "boom" and #v.log1 == 0
    local cok, cerr = coroutine.close(v.co1)
    local errored = pending and not cok and cerr == "boom" and #v.log1 == 2
      and v.log1[1] == "inner:boom" and v.log1[2] == "outer:boom"
    local closed = coroutine.close(v.co2) and #v.log2 == 2
      and v.log2[1] == "inner:nil" and v.log2[2] == "outer:nil"
    return errored and closed and coroutine.status(v.co1) == "dead"
  end },
  { "test55yieldinclose", function(v)
    return resumes(v.co, true, "after") and v.log[1] == "closing" and v.log[2] == "closed"
  end },
  { "test55yieldinreturnclose", function(v)
    return resumes(v.co, true, "r1", "r2", "r3") and v.log[1] == "closing" and v.log[2] == "closed"
      and coroutine.status(v.co) == "dead"
  end },
  { "test55namedvarargs", function(v) return resumes(v, true, 60, 3) end },
  { "test55global", function(v)
    counter55 = 10
    return v() == 11 and v() == 12 and counter55 == 12
  end },
  { "test55forloop", function(v)
    return resumes(v, true, 2) and resumes(v, true, 3) and resumes(v, true, 18)
  end },
}

-- One case per metamethod that can yield.
local metaops = {
  "__index", "__newindex", "__call", "__add", "__sub", "__mul", "__div", "__mod", "__pow",
  "__unm", "__idiv", "__band", "__bor", "__bxor", "__shl", "__shr", "__bnot", "__concat",
  "__len", "__eq", "__lt", "__le",
}

local function readfile(name)
  local f = io.open(dir .. "/" .. name, "rb")
  if not f then return nil end
  local data = f:read("a")
  f:close()
  return data
end

eris.settings("path", true)
uperms = {
  _ENV = _ENV,
  [1] = coroutine.yield,
  [2] = permtable,
  [3] = pcall,
  [4] = xpcall,
}

local function load_case(name)
  local data = readfile(name .. ".bin")
  if not data then
    return false, "persist: " .. (readfile(name .. ".err") or "no file written")
  end
  local ok, v = pcall(eris.unpersist, uperms, data)
  if not ok then return false, "unpersist: " .. tostring(v) end
  return true, v
end

local function report(name, ok, why)
  if ok then
    print("CASE " .. name .. " PASSED")
  else
    print("CASE " .. name .. " FAILED " .. tostring(why):gsub("\n", " "))
  end
end

local function run(name, check, value)
  local ok, res = pcall(check, value)
  if not ok then
    report(name, false, "check raised: " .. tostring(res))
  else
    report(name, res, "wrong result")
  end
end

-- Each case from its own save.
for _, c in ipairs(checks) do
  local name, check = c[1], c[2]
  local ok, v = load_case(name)
  if ok then run(name, check, v.value) else report(name, false, v) end
end
do
  local ok, v = load_case("test55metayields")
  for _, op in ipairs(metaops) do
    local name = "test55yield" .. op
    if not ok then
      report(name, false, v)
    else
      run(name, function(threads)
        local t = threads.value[op]
        if op == "__newindex" then
          return resumes(t.co, true, "set")
        end
        return resumes(t.co, true, t.expect)
      end, v)
    end
  end
end

-- The whole root in one save, as Eris's own test does.
do
  local ok, root = load_case("_root")
  if not ok then
    report("wholeroot", false, root)
  else
    local all, why = true, nil
    for _, c in ipairs(checks) do
      local okc, res = pcall(c[2], root[c[1]])
      if not (okc and res) then all, why = false, c[1] .. (okc and ": wrong result" or (": " .. tostring(res))); break end
    end
    report("wholeroot", all, why)
  end
end
