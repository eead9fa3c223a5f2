-- Eris's own test suite (fnuecke/eris, test/persist.lua, branch master-lua5.3), ported to
-- Lua 5.5 and luasnap, plus cases for what Eris never had (see "luasnap additions").
--
-- Run by tests/eris_suite.rs in a process of its own: it builds the values and writes one save
-- per case (and one of the whole root, as Eris does) into the directory given as `...`. A second
-- process that never ran this file loads them with tests/eris/unpersist.lua.
--
-- Port notes (what differs from Eris's file, and why):
-- * Eris's C host makes light userdata with a fixed address (321) and boxes with per-object
--   metatables. luasnap hosts have no such C code: `createludata` takes a light userdata from
--   `debug.upvalueid` and the check compares addresses printed with %p; `boxinteger` and
--   `boxboolean` give a plain-data box a metatable of its own with `debug.setmetatable`
--   (tests/eris_suite.rs defines them).
-- * Each case is also saved on its own, so one case that cannot be saved does not hide the
--   others (Eris saves one root: any failure fails all).

local out = ...
local rootobj = {}
local cases = {}           -- { name, value } in order
local function case(name, value)
  cases[#cases + 1] = { name, value }
  rootobj[name] = value
end

-------------------------------------------------------------------------------
-- Used by the userdata callbacks, so defined first.

function booleanpersist(udata)
  local b = unboxboolean(udata)
  return function()
    return boxboolean(b)
  end
end

-------------------------------------------------------------------------------
-- Permanent values.
local permtable = { 1234 }
case("testperm", permtable)

-------------------------------------------------------------------------------
-- Basic value types.
case("testnil", nil)
case("testfalse", false)
case("testtrue", true)
do
  local ud = createludata()
  case("testludata", { ud = ud, addr = string.format("%p", ud) })
end
case("testseven", 7)
case("testint", (0xFFFFFFFF ~= -1) and (0xFFFFFFFF00000000 | 0x00000000FFFFFFFF) or (0xFFFF0000 | 0x0000FFFF))
case("testfoobar", "foobar")

-------------------------------------------------------------------------------
-- Tables.
case("testtbl", { a = 2, [2] = 4 })

-------------------------------------------------------------------------------
-- NaNs in tables (checks that this doesn't break the internal ref table).
do
  local nantable = {}
  nantable[1] = 0/0
  case("testnan", nantable)
end

-------------------------------------------------------------------------------
-- Cycles in tables.
do
  local testloopa = {}
  local testloopb = { testloopa = testloopa }
  testloopa.testloopb = testloopb
  case("testlooptable", testloopa)
end

-------------------------------------------------------------------------------
-- Metatables.
do
  local twithmt = {}
  setmetatable(twithmt, { __call = function() return 21 end })
  case("testmt", twithmt)
end

-------------------------------------------------------------------------------
-- Yet more metatables.
do
  local niinmt = { a = 3 }
  setmetatable(niinmt, { __newindex = function(key, val) end })
  case("testniinmt", niinmt)
end

-------------------------------------------------------------------------------
-- Literal userdata.
case("testliteraludata", boxinteger(71))

-------------------------------------------------------------------------------
-- Functions (closures without upvalues).
local function func()
  return 4
end
case("testfuncreturnsfour", func)

-------------------------------------------------------------------------------
-- Environment. Envs are just upvalues since 5.2, but still worth a case.
do
  local testfenv = (function()
    local _ENV = { abc = 456 }
    return function()
      return abc
    end
  end)()
  case("testfenv", testfenv)
end

-------------------------------------------------------------------------------
-- Closures.
do
  local function funcreturningclosure(n)
    return function()
      return n
    end
  end
  case("testclosure", funcreturningclosure(11))
  case("testnilclosure", funcreturningclosure(nil))
end

-------------------------------------------------------------------------------
-- More closures.
do
  local function nestedfunc(n)
    return (function(m) return m + 2 end)(n + 3)
  end
  case("testnest", nestedfunc)
end

-------------------------------------------------------------------------------
-- Cycles in upvalues.
do
  local function GenerateObjects()
    local Table = {}

    function Table:Func()
      return { Table, self }
    end

    function uvcycle()
      return Table:Func()
    end
  end

  GenerateObjects()
  case("testuvcycle", uvcycle)
end

-------------------------------------------------------------------------------
-- Special callback for persisting tables.
do
  local sptable = { a = 3 }
  setmetatable(sptable, {
    __persist = function(tbl)
      local a = tbl.a
      return function()
        return { a = a + 3 }
      end
    end
  })
  case("testsptable", sptable)
end

-------------------------------------------------------------------------------
-- Special callbacks for persisting userdata.
case("testspudata", { boxboolean(true), boxboolean(false) })

-------------------------------------------------------------------------------
-- Reference correctness.
do
  local sharedref = {}
  refa = { sharedref = sharedref }
  refb = { sharedref = sharedref }
  case("testsharedref", { refa, refb })
end

-------------------------------------------------------------------------------
-- Shared upvalues (like reference correctness for upvalues).
do
  local function makecounter()
    local a = 0
    return {
      inc = function() a = a + 1 end,
      cur = function() return a end
    }
  end
  case("testsharedupval", makecounter())
end

-------------------------------------------------------------------------------
-- Debug info.
do
  local function debuginfo(foo)
    foo = foo + foo
    return debug.getlocal(1, 1)
  end
  case("testdebuginfo", debuginfo)
end

-------------------------------------------------------------------------------
-- Suspended thread.
do
  local function fc(i)
    local ic = i + 1
    coroutine.yield()
    return ic * 2
  end

  local function fb(i)
    local ib = i + 1
    ib = ib + fc(ib)
    return ib
  end

  local function fa(i)
    local ia = i + 1
    return fb(ia)
  end

  local thr = coroutine.create(fa)
  coroutine.resume(thr, 2)
  case("testthread", thr)
end

-------------------------------------------------------------------------------
-- Not yet started thread.
case("testnthread", coroutine.create(function() return func() end))

-------------------------------------------------------------------------------
-- Dead thread.
do
  local deadthr = coroutine.create(function() return func() end)
  coroutine.resume(deadthr)
  case("testdthread", deadthr)
end

-------------------------------------------------------------------------------
-- Open upvalues (stored in thread stack).
do
  local function uvinthreadfunc()
    local a = 1
    local b = function()
      a = a + 1
      coroutine.yield(a)
      a = a + 1
    end
    a = a + 1
    b()
    a = a + 1
    return a
  end

  local uvinthread = coroutine.create(uvinthreadfunc)
  coroutine.resume(uvinthread)
  case("testuvinthread", uvinthread)
end

-------------------------------------------------------------------------------
-- Yield across pcall.
local function protf(arg)
  coroutine.yield()
  error(arg, 0)
end
do
  local function protthreadfunc()
    local res, err = pcall(protf, "test")
    return err
  end

  local protthr = coroutine.create(protthreadfunc)
  coroutine.resume(protthr)
  case("testprotthr", protthr)
end

-------------------------------------------------------------------------------
-- Yield across xpcall with message handler.
do
  local function xprotthreadfunc()
    local function handler(msg)
      return "handler:" .. msg
    end
    local res, err = xpcall(protf, handler, "test")
    return err
  end

  local xprotthr = coroutine.create(xprotthreadfunc)
  coroutine.resume(xprotthr)
  case("testxprotthr", xprotthr)
end

-------------------------------------------------------------------------------
-- Yield out of metafunction.
do
  local function ymtf(arg)
    coroutine.yield()
    return true
  end
  function ymtthreadfunc()
    local t = setmetatable({}, { __lt = ymtf })
    return t < 5
  end

  local ymtthr = coroutine.create(ymtthreadfunc)
  coroutine.resume(ymtthr)
  case("testymtthr", ymtthr)
end

-------------------------------------------------------------------------------
-- Deep callstacks (100 levels).
do
  local function deepfunc(x)
    x = x or 0
    if x == 100 then
      coroutine.yield()
      return x
    end
    local result = deepfunc(x + 1) -- no tailcall
    return result
  end

  local deepcall = coroutine.wrap(deepfunc)
  deepcall()
  case("testdeep", deepcall)
end

-------------------------------------------------------------------------------
-- Tail calls.
do
  local function tailfunc()
    local function tailer(x)
      x = x or 0
      if x == 100 then
        coroutine.yield()
        return x
      end
      return tailer(x + 1)
    end
    local result = tailer()
    return result
  end

  function wrap(t)
    local co = coroutine.create(t)
    return function(...)
      local res = { coroutine.resume(co, ...) }
      if res[1] then return select(2, table.unpack(res)) end
      error(select(2, table.unpack(res)), 0)
    end
  end

  local tailcall = wrap(tailfunc)
  tailcall()
  case("testtail", tailcall)
end

-------------------------------------------------------------------------------
-- luasnap additions: what Lua 5.4 and 5.5 added, which Eris never had.

-- Integer and float subtypes stay apart, with their exact values.
case("test55numbers", { 3, 3.0, -0.0, 1/0, -1/0, math.mininteger, math.maxinteger, 2^53 + 1, 0x7ff })

-- <const> locals captured as upvalues (constants folded away are not upvalues at all).
do
  local k <const> = { "const table" }
  local n <const> = 42
  case("test55const", function() return k[1], n end)
end

-- A coroutine suspended with a pending to-be-closed variable: closing it after the load runs
-- __close exactly once, and resuming it to the end does too.
do
  local function closing(log, tag)
    return setmetatable({}, { __close = function(_, err) log[#log + 1] = tag .. ":" .. tostring(err) end })
  end
  local log1 = {}
  local co1 = coroutine.create(function()
    local x <close> = closing(log1, "a")
    coroutine.yield(1)
    return "done"
  end)
  coroutine.resume(co1)
  local log2 = {}
  local co2 = coroutine.create(function()
    local x <close> = closing(log2, "b")
    coroutine.yield(1)
    return "done"
  end)
  coroutine.resume(co2)
  case("test55close", { co1 = co1, log1 = log1, co2 = co2, log2 = log2 })
end

-- Two pending to-be-closed variables (and a false one, never closed) in nested frames: after
-- the load, an error leaves them pending and coroutine.close then closes them innermost first,
-- each once, with the error object; coroutine.close on a second such coroutine closes them in
-- the same order with no error.
do
  local function closing(log, tag)
    return setmetatable({}, { __close = function(_, err) log[#log + 1] = tag .. ":" .. tostring(err) end })
  end
  local function body(log)
    return function()
      local a <close> = closing(log, "outer")
      local f <close> = false
      local function inner()
        local b <close> = closing(log, "inner")
        local v = coroutine.yield(1)
        if v == "fail" then error("boom", 0) end
        return v
      end
      return inner() .. "!"
    end
  end
  local log1, log2 = {}, {}
  local co1 = coroutine.create(body(log1))
  coroutine.resume(co1)
  local co2 = coroutine.create(body(log2))
  coroutine.resume(co2)
  case("test55closeerror", { co1 = co1, log1 = log1, co2 = co2, log2 = log2 })
end

-- A coroutine suspended inside a __close handler that yields.
do
  local log = {}
  local co = coroutine.create(function()
    do
      local x <close> = setmetatable({}, { __close = function()
        log[#log + 1] = "closing"
        coroutine.yield("in close")
        log[#log + 1] = "closed"
      end })
    end
    return "after"
  end)
  coroutine.resume(co)
  case("test55yieldinclose", { co = co, log = log })
end

-- The same inside a return that closes a variable (the results wait for __close), and with a
-- multiple-result return from a vararg function.
do
  local log = {}
  local co = coroutine.create(function(...)
    local x <close> = setmetatable({}, { __close = function()
      log[#log + 1] = "closing"
      coroutine.yield("in close")
      log[#log + 1] = "closed"
    end })
    return "r1", ...
  end)
  coroutine.resume(co, "r2", "r3")
  case("test55yieldinreturnclose", { co = co, log = log })
end

-- Lua 5.5's named varargs (`...t`) in a suspended frame.
do
  local ok, f = pcall(load, [[
    return function(...t)
      coroutine.yield(#t)
      return t[1] + t[2] + t[3], t.n
    end
  ]], "=varargs")
  local co = coroutine.create(f())
  coroutine.resume(co, 10, 20, 30)
  case("test55namedvarargs", co)
end

-- `global` declarations (5.5): a function whose free names are declared.
do
  local f = load([[
    global print, tostring
    global counter55
    counter55 = 0
    return function() counter55 = counter55 + 1; return counter55 end
  ]], "=globals")()
  case("test55global", f)
end

-- A coroutine suspended in the middle of a generic for over a yielding iterator.
do
  local co = coroutine.create(function()
    local sum = 0
    for i, v in ipairs({ 5, 6, 7 }) do
      sum = sum + v
      coroutine.yield(i)
    end
    return sum
  end)
  coroutine.resume(co)
  case("test55forloop", co)
end

-- Yields inside every metamethod that can yield. Each coroutine is suspended inside the
-- metamethod; resumed after the load, it must finish the operation with the right result.
do
  local function yielding(result)
    return function(...)
      coroutine.yield("in metamethod")
      return result
    end
  end
  local ops = {
    { "__index", function(t) return t.missing end, "idx" },
    { "__newindex", function(t) t.missing = 1; return "set" end, "set" },
    { "__call", function(t) return t(1, 2) end, "called" },
    { "__add", function(t) return t + 1 end, 101 },
    { "__sub", function(t) return t - 1 end, 102 },
    { "__mul", function(t) return t * 2 end, 103 },
    { "__div", function(t) return t / 2 end, 104 },
    { "__mod", function(t) return t % 2 end, 105 },
    { "__pow", function(t) return t ^ 2 end, 106 },
    { "__unm", function(t) return -t end, 107 },
    { "__idiv", function(t) return t // 2 end, 108 },
    { "__band", function(t) return t & 1 end, 109 },
    { "__bor", function(t) return t | 1 end, 110 },
    { "__bxor", function(t) return t ~ 1 end, 111 },
    { "__shl", function(t) return t << 1 end, 112 },
    { "__shr", function(t) return t >> 1 end, 113 },
    { "__bnot", function(t) return ~t end, 114 },
    { "__concat", function(t) return t .. "x" end, "cat" },
    { "__len", function(t) return #t end, 115 },
    { "__eq", function(t) return t == setmetatable({}, getmetatable(t)) end, true },
    { "__lt", function(t) return t < t end, true },
    { "__le", function(t) return t <= t end, true },
  }
  local threads = {}
  for _, op in ipairs(ops) do
    local name, body, result = op[1], op[2], op[3]
    local mt = { [name] = yielding(result) }
    if name == "__newindex" then
      mt[name] = function(t, k, v) coroutine.yield("in metamethod"); rawset(t, k, "via " .. tostring(v)) end
    end
    local co = coroutine.create(function() return body(setmetatable({}, mt)) end)
    local ok, what = coroutine.resume(co)
    assert(ok and what == "in metamethod", name)
    threads[name] = { co = co, expect = result }
  end
  case("test55metayields", threads)
end

-------------------------------------------------------------------------------
-- Do actual persisting with some perms.

eris.settings("path", true)

perms = {
  [_ENV] = "_ENV",
  [coroutine.yield] = 1,
  [permtable] = 2,
  [pcall] = 3,
  [xpcall] = 4,
}

local function write(name, data)
  local f = assert(io.open(out .. "/" .. name, "wb"))
  f:write(data)
  f:close()
end

local function save(name, value)
  local ok, data = pcall(eris.persist, perms, value)
  if ok then
    write(name .. ".bin", data)
  else
    write(name .. ".err", tostring(data))
  end
end

for _, c in ipairs(cases) do
  save(c[1], { value = c[2] })
end
save("_root", rootobj)
