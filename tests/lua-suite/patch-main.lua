-- Patches a copy of Lua 5.5.1's testes/main.lua for CI (see tests/lua-suite-skips.md).
-- Its Ctrl-C tests start a script with `lua -e ... & echo $!` and read the pid first, which
-- races the script's own first line (stock lua fails it too, about 1 run in 6). Here an inner
-- shell prints its pid and then execs lua (same pid, so the signals reach the script; output
-- in a fixed order), and the outer shell exits 0 as the backgrounding one did. The signals
-- sent and every check stay as they are.
local path = ...
local f = assert(io.open(path, "rb"))
local src = f:read("a")
f:close()
local old = [['%s -e "%s" & echo $!']]
local new = [['sh -c "echo \\$\\$; exec %s -e \\"%s\\""; true']]
local i, j = src:find(old, 1, true)
assert(i and not src:find(old, j + 1, true), "main.lua's Ctrl-C launcher changed: update tests/lua-suite/patch-main.lua")
src = src:sub(1, i - 1) .. new .. src:sub(j + 1)
f = assert(io.open(path, "wb"))
f:write(src)
f:close()
