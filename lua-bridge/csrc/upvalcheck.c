/*
** Open upvalues of loaded coroutines: the loader's check of each one (luasnap_open_upval_check).
**
** An open upvalue is a pointer into a coroutine's stack that its closures read and write
** without any check. In an honest state it is a local variable of the frame of the function
** that declared it, shared only by closures that function made for that variable; the VM
** trusts that nothing else writes the registers it keeps for itself (table constructors'
** temporaries, a frame's function slot) and that nothing writes the locals the compiler
** refuses assignment to (a numeric for loop's control variable, which OP_FORLOOP updates in
** place with chgivalue; a named vararg table, which OP_VARARG reads as a Table*). The
** loader's rule (luasnap_open_upval_check) rebuilds that invariant for each closure an open
** upvalue of a loaded coroutine is joined to:
**   1. the slot is a register of the Lua frame with the highest function slot below it, and
**      that register holds a local variable active where the frame is suspended (debug
**      information: locvars with startpc <= pc < endpc; the n-th active one is register
**      n - 1, as luaF_getlocalname counts them);
**   2. the frame is not suspended where its upvalues are already closed (a __close call of
**      OP_CLOSE A for r >= A, of a closing OP_RETURN, or a closing OP_TAILCALL), and its
**      function closes its upvalues when it returns (proto_closes: otherwise the upvalue
**      stays open above the stack once the frame returns, and a collection shrinking the
**      stack leaves it dangling);
**   3. the closure's prototype is nested in the frame's function, and its upvalue's
**      descriptor chain (instack = 0 with the index of the enclosing function's upvalue, up
**      to the frame's function's child, with instack = 1) names that register;
**   4. that child (OP_CLOSURE at pc_c in the frame's function) was made while that same
**      variable was active (startpc <= pc_c < endpc), or it is the variable's own recursive
**      local function (localfunc sets startpc just after the OP_CLOSURE storing into it).
** With 3 and 4 the closure's code was compiled for that very variable, so it writes it only
** if the language lets it (lparser.c's check_readonly refuses assignment to const, for-loop
** control and vararg-table variables, in nested functions too: their upvalue descriptors
** carry the variable's kind). Registers that hold no active local (constructor temporaries,
** function slots, arguments being passed) pass neither 1 nor 3. A prototype without debug
** information (a stripped binary chunk) has no locvars: foreign loads refuse open upvalues
** into its frames; own loads check 2 and 3 only. Prototypes are the VM's own (foreign loads
** find them among its live ones), so their code is what Lua's compiler produced.
*/
#include "loadmemo.h"
#include "lopcodes.h"

/* Whether every return of p closes the upvalues still open in its frame. With a captured
** local (lparser.c: 'needclose'), luaK_finish gives OP_RETURN and OP_TAILCALL the k flag and
** turns OP_RETURN0/OP_RETURN1 into OP_RETURN; without one, a return leaves them open. */
static int proto_closes(const Proto *p) {
  int q;
  for (q = 0; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    switch (GET_OPCODE(ins)) {
      case OP_RETURN0: case OP_RETURN1: return 0;
      case OP_RETURN: case OP_TAILCALL: if (!TESTARG_k(ins)) return 0; break;
      default: break;
    }
  }
  return 1;
}

/* A prototype's locals by register (see locals_index): its locvars indices sorted by register
** (depth: how many locals contain each), then by startpc; off[d] .. off[d + 1] are those of
** register d. NULL in the memo's list: its locvars are not nested that way (checked). */
struct ls_vartab {
  int ndepth;  /* registers with locals: off has ndepth + 1 entries */
  int *off;
  int *byd;
};

/* Finds the path from root down to the nested prototype target (path[0] = root); returns its
** length, or 0 if target is not nested in root. Lua nests functions at most LUAI_MAXCCALLS
** (200) deep; deeper paths (none) are not followed. */
static int proto_path(const Proto *root, const Proto *target, const Proto **path, int depth) {
  int i;
  if (depth >= 250) return 0;
  path[depth] = root;
  if (root == target) return depth + 1;
  for (i = 0; i < root->sizep; i++) {
    int len = proto_path(root->p[i], target, path, depth + 1);
    if (len > 0) return len;
  }
  return 0;
}

/* Records the parent and index of every prototype in x's subtree (x at depth `depth` of the
** walk), once per load for each subtree. Sets m->nomap if the prototypes do not form a tree
** (a prototype in two places) or nest 250 deep (Lua nests functions at most 200 deep), so
** captures keeps proto_path's answers exactly. Returns 0 if out of memory. */
static int map_tree(ls_upmemo *m, const Proto *x, int depth) {
  int i, val;
  if (m->nomap || ls_upget(m, LS_Q_MAPPED, x, NULL, 0, 0, &val)) return 1;
  if (depth >= 250) {
    m->nomap = 1;
    return 1;
  }
  for (i = 0; i < x->sizep; i++) {
    const Proto *c = x->p[i];
    if (ls_upget(m, LS_Q_PARENT, c, NULL, 0, 0, &val)) {
      if (val != i || ls_upslot(m, LS_Q_PARENT, c, NULL, 0, 0)->v != (const void *)x) {
        m->nomap = 1;  /* c is in two places */
        return 1;
      }
    } else {
      if (!ls_upput(m, LS_Q_PARENT, c, NULL, 0, 0, i)) return 0;
      ls_upslot(m, LS_Q_PARENT, c, NULL, 0, 0)->v = x;
    }
    if (!map_tree(m, c, depth + 1)) return 0;
  }
  return ls_upput(m, LS_Q_MAPPED, x, NULL, 0, 0, 0);
}

/* proto_path by the parents map_tree recorded: the path from root down to target, or 0. Its
** answer is proto_path's when the prototypes form a tree (m->nomap unset): the one path, if
** target is at most 249 levels under root. */
static int proto_path_mapped(ls_upmemo *m, const Proto *root, const Proto *target,
                             const Proto **path) {
  const Proto *up[250];
  const Proto *x = target;
  int n = 0, j, val;
  while (x != root) {
    if (n >= 249 || !ls_upget(m, LS_Q_PARENT, x, NULL, 0, 0, &val)) return 0;
    up[n++] = x;
    x = (const Proto *)ls_upslot(m, LS_Q_PARENT, x, NULL, 0, 0)->v;
  }
  path[0] = root;
  for (j = 0; j < n; j++) path[j + 1] = up[n - 1 - j];
  return n + 1;
}

/* captures walks fp's tree (proto_path) for its first LS_WALKS_BEFORE_MAP distinct questions
** (a few: honest coroutines ask one or two per frame function), then maps it (map_tree: more
** memory and time than one walk, less than many). */
#define LS_WALKS_BEFORE_MAP 4

/* Rule 3: the index of fp's child through which upvalue n of a closure of xp names register
** r of fp's frame, or -1; -2 if out of memory. Answers for xp nested in fp are kept (their
** number is bounded by the code); a refusal for xp not nested in fp is not (the pair would be
** the file's choice, and the load ends with that refusal anyway). The path from fp to xp
** comes from the parents map_tree records (fp's tree walked once per load), or from a walk
** (proto_path) if the prototypes are not a tree. */
static int captures(ls_upmemo *m, const Proto *fp, const Proto *xp, int n, int r) {
  const Proto *path[256];
  int len, j, k = -1, mapped;
  const Upvaldesc *d;
  if (ls_upget(m, LS_Q_CAPTURES, fp, xp, n, r, &k)) return k;
  mapped = ls_upget(m, LS_Q_MAPPED, fp, NULL, 0, 0, &j);
  if (!mapped && !m->nomap) {
    int walked = 0;
    if (!ls_upget(m, LS_Q_WALKS, fp, NULL, 0, 0, &walked)
        && !ls_upput(m, LS_Q_WALKS, fp, NULL, 0, 0, 0))
      return -2;
    if (walked < LS_WALKS_BEFORE_MAP) {
      ls_upslot(m, LS_Q_WALKS, fp, NULL, 0, 0)->val = walked + 1;
      mapped = -1;  /* walk this time */
    } else {
      m->walks++;
      if (!map_tree(m, fp, 0)) return -2;
    }
  }
  if (m->nomap || mapped == -1) {
    m->walks++;
    len = proto_path(fp, xp, path, 0);
  } else {
    len = proto_path_mapped(m, fp, xp, path);
  }
  if (len >= 2 && n >= 1 && n <= xp->sizeupvalues) {
    d = &xp->upvalues[n - 1];
    for (j = len - 1; j > 1 && !d->instack && d->idx < path[j - 1]->sizeupvalues; j--)
      d = &path[j - 1]->upvalues[d->idx];
    if (j == 1 && d->instack && d->idx == r) {
      if (!m->nomap && mapped != -1) {  /* path[1], fp's child in one place: index recorded */
        if (!ls_upget(m, LS_Q_PARENT, path[1], NULL, 0, 0, &k)) k = -1;
      } else {
        for (k = 0; k < fp->sizep && fp->p[k] != path[1]; k++) {}
        if (k == fp->sizep) k = -1;
      }
    }
  }
  if (len >= 2 && !ls_upput(m, LS_Q_CAPTURES, fp, xp, n, r, k)) return -2;
  return k;
}

/* The pc of the first OP_CLOSURE that makes child k of p, or -1; -2 if out of memory. The
** first LS_WALKS_BEFORE_MAP distinct questions about p scan its code up to the answer; the
** next one records the first OP_CLOSURE of every child in one scan (LS_Q_CLOSURES: the scans
** so far, -1 once all are recorded). */
static int closure_pc(ls_upmemo *m, const Proto *p, int k) {
  int q, at = -1, done = 0;
  if (ls_upget(m, LS_Q_CLOSURE, p, NULL, k, 0, &at)) return at;
  if (!ls_upget(m, LS_Q_CLOSURES, p, NULL, 0, 0, &done)
      && !ls_upput(m, LS_Q_CLOSURES, p, NULL, 0, 0, 0))
    return -2;
  if (done < 0) return -1;
  if (done < LS_WALKS_BEFORE_MAP) {
    ls_upslot(m, LS_Q_CLOSURES, p, NULL, 0, 0)->val = done + 1;
    for (q = 0; q < p->sizecode; q++)
      if (GET_OPCODE(p->code[q]) == OP_CLOSURE && GETARG_Bx(p->code[q]) == k) {
        at = q;
        break;
      }
    return ls_upput(m, LS_Q_CLOSURE, p, NULL, k, 0, at) ? at : -2;
  }
  for (q = 0; q < p->sizecode; q++)
    if (GET_OPCODE(p->code[q]) == OP_CLOSURE) {
      int c = GETARG_Bx(p->code[q]);
      if (!ls_upget(m, LS_Q_CLOSURE, p, NULL, c, 0, &done)
          && !ls_upput(m, LS_Q_CLOSURE, p, NULL, c, 0, q))
        return -2;
    }
  ls_upslot(m, LS_Q_CLOSURES, p, NULL, 0, 0)->val = -1;
  return ls_upget(m, LS_Q_CLOSURE, p, NULL, k, 0, &at) ? at : -1;
}

/* Rule 1 by a scan: the locvar active in register r of p at pc, or -1: the (r + 1)-th of
** p's locvars (in order, stopping at the first with startpc > pc) with startpc <= pc < endpc,
** as luaF_getlocalname counts them (see tbc_in_scope, coload.c). 0 <= r < 256. */
static int active_var_scan(const Proto *p, int pc, int r) {
  int i, n = 0;
  for (i = 0; i < p->sizelocvars && p->locvars[i].startpc <= pc; i++)
    if (pc < p->locvars[i].endpc) {
      if (n == r) return i;
      n++;
    }
  return -1;
}

/* Builds p's locals index, or NULL (*oom set if out of memory) when p's locvars are not
** nested as Lua's compiler makes them: startpc never decreasing, and each nonempty one either
** inside every earlier one that is still open at its startpc (startpc < endpc) or after it.
** Then the locals active at any pc are a chain, each inside the ones before it, so the one in
** register d (the (d + 1)-th active, active_var_scan) is the one with d earlier locals
** containing it (its depth) whose range holds pc; those of one depth do not overlap and are
** sorted by startpc. O(p's locvars). */
static ls_vartab *locals_index(const Proto *p, int *oom) {
  int L = p->sizelocvars, i, top = 0, ndepth = 0;
  int *depth, *stack, *fill;
  ls_vartab *t = NULL;
  *oom = 0;
  for (i = 1; i < L; i++)
    if (p->locvars[i].startpc < p->locvars[i - 1].startpc) return NULL;
  depth = (int *)malloc(2 * (size_t)(L > 0 ? L : 1) * sizeof(int));
  if (depth == NULL) {
    *oom = 1;
    return NULL;
  }
  stack = depth + L;
  for (i = 0; i < L; i++) {
    const LocVar *v = &p->locvars[i];
    depth[i] = -1;  /* empty: never active */
    if (v->startpc >= v->endpc) continue;
    while (top > 0 && p->locvars[stack[top - 1]].endpc <= v->startpc) top--;
    if (top > 0 && v->endpc > p->locvars[stack[top - 1]].endpc) {
      free(depth);
      return NULL;  /* overlaps an earlier one without being inside it */
    }
    if (top < 256) {  /* registers above 255 are never asked */
      depth[i] = top;
      if (top + 1 > ndepth) ndepth = top + 1;
    }
    stack[top++] = i;
  }
  t = (ls_vartab *)malloc(sizeof(ls_vartab) + ((size_t)ndepth + 1 + (size_t)L) * sizeof(int));
  if (t == NULL) {
    free(depth);
    *oom = 1;
    return NULL;
  }
  t->ndepth = ndepth;
  t->off = (int *)(t + 1);
  t->byd = t->off + ndepth + 1;
  for (i = 0; i <= ndepth; i++) t->off[i] = 0;
  for (i = 0; i < L; i++)
    if (depth[i] >= 0) t->off[depth[i] + 1]++;
  for (i = 0; i < ndepth; i++) t->off[i + 1] += t->off[i];
  fill = stack;  /* reused: next free place per depth */
  for (i = 0; i < ndepth; i++) fill[i] = t->off[i];
  for (i = 0; i < L; i++)
    if (depth[i] >= 0) t->byd[fill[depth[i]]++] = i;
  free(depth);
  return t;
}

/* Rule 1: the locvar active in register r of p at pc, or -1 (active_var_scan's answer);
** -2 if out of memory. 0 <= r < 256. O(log locvars) with p's locals index, built on p's first
** question; a prototype whose locvars are not nested as the compiler makes them (a binary
** chunk's) answers each distinct question by a scan, once. */
static int active_var(ls_upmemo *m, const Proto *p, int pc, int r) {
  int ti, var = -1, oom;
  const ls_vartab *t;
  if (!ls_upget(m, LS_Q_VARTAB, p, NULL, 0, 0, &ti)) {
    ls_vartab *nt = locals_index(p, &oom);
    if (oom) return -2;
    ti = -1;
    if (nt != NULL) {
      if (m->ntabs == m->captabs) {
        size_t cap = m->captabs ? 2 * m->captabs : 16;
        ls_vartab **g = (cap <= SIZE_MAX / sizeof(*g) && cap <= INT_MAX)
                            ? (ls_vartab **)realloc(m->tabs, cap * sizeof(*g)) : NULL;
        if (g == NULL) {
          free(nt);
          return -2;
        }
        m->tabs = g;
        m->captabs = cap;
      }
      ti = (int)m->ntabs;
      m->tabs[m->ntabs++] = nt;
    }
    if (!ls_upput(m, LS_Q_VARTAB, p, NULL, 0, 0, ti)) return -2;
  }
  if (ti < 0) {  /* not nested as compiled: the scan, once per question */
    if (ls_upget(m, LS_Q_VAR, p, NULL, pc, r, &var)) return var;
    var = active_var_scan(p, pc, r);
    if (!ls_upput(m, LS_Q_VAR, p, NULL, pc, r, var)) return -2;
    return var;
  }
  t = m->tabs[ti];
  if (r < t->ndepth) {
    int lo = t->off[r], hi = t->off[r + 1];  /* last one of depth r starting at or before pc */
    while (hi - lo > 1) {
      int mid = (lo + hi) / 2;
      if (p->locvars[t->byd[mid]].startpc <= pc) lo = mid;
      else hi = mid;
    }
    if (lo < t->off[r + 1]) {
      const LocVar *v = &p->locvars[t->byd[lo]];
      if (v->startpc <= pc && pc < v->endpc) var = t->byd[lo];
    }
  }
  /* Invariant the index relies on (checked by locals_index), tested in assertion builds. */
  lua_assert(var == active_var_scan(p, pc, r));
  return var;
}

/* Checks that the Lua closure at idx may have its upvalue n open at slot `level` of the loaded
** coroutine co (rules 1-4 above), co's frames being frames[0..nframes) (luasnap_thread_frames,
** taken when its frames were restored; co has not run since: the loader keeps it unresumable
** until the load ends, and this checks it was not reset). `strict` (foreign loads) refuses
** frames without debug information. `memo` is luasnap_upmemo_size() bytes, zeroed before the
** first call for a load and given to luasnap_upmemo_free when the load ends. O(log frames)
** + log locals per call, plus, the first time the load asks about a prototype (see
** ls_upmemo), a scan of the frame's function (its locals or code) or a walk of its nested
** prototypes. Reads only Lua's
** state. Returns NULL or why the upvalue is refused (LS_UPMEMO_OOM: the memo's table could
** not grow). */
#define LS_UPMEMO_OOM \
  "out of memory for the open-upvalue check's tables (the process cannot allocate; free memory and load again)"
const char *luasnap_open_upval_check(lua_State *L, int idx, int n, lua_State *co, int level,
                                     const void *const *frames, int nframes, int strict,
                                     void *memo) {
  ls_upmemo *m = (ls_upmemo *)memo;
  const TValue *o = ls_index2value(L, idx);
  const LClosure *cl;
  const CallInfo *ci;
  const Proto *p;
  int lo = 0, hi = nframes, r, pc, var, k, closes;
  Instruction ins;
  if (!ttisLclosure(o)) return "internal: an open upvalue of something else than a Lua closure";
  cl = clLvalue(o);
  if (n < 1 || n > cl->nupvalues) return "internal: no such upvalue";
  if (co->status != LUA_ERRERR || nframes < 1 || co->ci != (const CallInfo *)frames[nframes - 1])
    return "an open upvalue into a coroutine that load-time code reset";
  if (level < 1 || level >= (int)(co->top.p - co->stack.p))
    return "an open upvalue outside its coroutine's stack";
  /* The frame with the highest function slot below level (frames ascend: restore checks). */
  while (hi - lo > 1) {
    int mid = (lo + hi) / 2;
    if (((const CallInfo *)frames[mid])->func.p - co->stack.p < level) lo = mid;
    else hi = mid;
  }
  ci = (const CallInfo *)frames[lo];
  if (ci->func.p - co->stack.p >= level || !isLua(ci))
    return "an open upvalue outside the local variables of its coroutine's Lua frames";
  p = clLvalue(s2v(ci->func.p))->p;
  r = level - (int)(ci->func.p - co->stack.p) - 1;
  if (r >= p->maxstacksize)
    return "an open upvalue outside the local variables of its coroutine's Lua frames";
  pc = (int)(ci->u.l.savedpc - p->code) - 1;  /* restored: 0 <= pc < sizecode */
  ins = p->code[pc];
  if ((GET_OPCODE(ins) == OP_CLOSE && r >= GETARG_A(ins))
      || ((GET_OPCODE(ins) == OP_RETURN || GET_OPCODE(ins) == OP_TAILCALL) && TESTARG_k(ins)))
    return "an open upvalue in a frame suspended where it has closed its upvalues";
  if (!ls_upget(m, LS_Q_CLOSES, p, NULL, 0, 0, &closes)) {
    closes = proto_closes(p);
    if (!ls_upput(m, LS_Q_CLOSES, p, NULL, 0, 0, closes)) return LS_UPMEMO_OOM;
  }
  if (!closes)
    return "an open upvalue in a frame whose function does not close its upvalues when it returns";
  var = -1;
  if (p->sizelocvars == 0) {
    if (strict)
      return "an open upvalue into a frame of a function without debug information (stripped): foreign loads cannot check which local it is";
  } else {
    var = active_var(m, p, pc, r);
    if (var == -2) return LS_UPMEMO_OOM;
    if (var < 0)
      return "an open upvalue on a register that holds no local variable where its frame is suspended";
  }
  k = captures(m, p, cl->p, n, r);
  if (k == -2) return LS_UPMEMO_OOM;
  if (k < 0)
    return "an open upvalue shared by a closure whose function cannot capture that local (not nested in the frame's function with an upvalue for it)";
  if (var >= 0) {
    const LocVar *v = &p->locvars[var];
    int at = closure_pc(m, p, k);
    if (at == -2) return LS_UPMEMO_OOM;
    if (at < 0 || !((v->startpc <= at && at < v->endpc)
                    || (at + 1 == v->startpc && GETARG_A(p->code[at]) == r)))
      return "an open upvalue shared by a closure made for another variable of that register";
  }
  return NULL;
}
