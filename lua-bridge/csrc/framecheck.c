/*
** Hostile-file checks of a loaded coroutine's frames: each frame against the instruction (or
** the C function) its caller is suspended in, and the registers a resumed Lua frame trusts
** without checking their types. For luasnap_thread_restore (coload.c), before the coroutine
** can run. With the load's memo (loadmemo.h), each prototype's code is indexed once per load
** (the index of frame-check registers below); without one, or for code not as the compiler
** makes it, the frame's function is scanned from where it is suspended (the same answers).
*/
#include "framecheck.h"
#include "loadmemo.h"
#include "lopcodes.h"

static const ls_siteidx *ls_sites_of(void *memo, const Proto *p);
static const char *ls_sites_check(const ls_siteidx *x, lua_State *co, const luasnap_ci *r,
                                  const Proto *p);

/* The registers a resumed Lua frame trusts to hold a table: OP_SETLIST writes into R[A]'s
** array without checking its type (the compiler made it with OP_NEWTABLE at the start of the
** constructor). A constructor is straight-line code from its OP_NEWTABLE to its last
** OP_SETLIST, so a SETLIST at or after the resume point whose OP_NEWTABLE for the same
** register is not between the two belongs to a constructor the frame is suspended in: its
** register must hold a table. Returns NULL or a static message. */
static const char *check_constructor_tables(lua_State *co, const luasnap_ci *r) {
  const Proto *p = clLvalue(s2v(co->stack.p + r->func))->p;
  unsigned char made[256];
  int q;
  memset(made, 0, sizeof made);
  for (q = r->pc - 1; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    int a = GETARG_A(ins);
    if (GET_OPCODE(ins) == OP_NEWTABLE) made[a & 0xff] = 1;
    else if (GET_OPCODE(ins) == OP_SETLIST && !made[a & 0xff]) {
      if (r->func + 1 + a >= r->top || !ttistable(s2v(co->stack.p + r->func + 1 + a)))
        return "a table constructor whose table is not a table";
    }
  }
  return NULL;
}

/* The other registers a resumed Lua frame trusts without checking their types:
**   - the control registers of every numeric for loop the frame is suspended inside (the
**     loop's OP_FORLOOP at q jumps back to q + 1 - Bx, so its body is [q + 1 - Bx, q]):
**     OP_FORLOOP updates R[A] and R[A+2] in place with chgivalue/chgfltvalue, which keep the
**     tag (a table there would get a counter as its pointer). Invariant checked: what
**     OP_FORPREP leaves (lvm.c, forprep): with an integer step R[A+1], the count R[A] and the
**     control variable R[A+2] are integers; otherwise all three are floats;
**   - the vararg table of a function that has one (PF_VATAB): OP_VARARG reads register
**     'numparams' with hvalue (luaT_getvarargs). Invariant checked: it holds a table, as
**     OP_VARARGPREP (the first instruction, before any yield) leaves it; the parameter is
**     read-only, so the function's code never changes it.
** Returns NULL or a static message. */
static const char *check_trusted_registers(lua_State *co, const luasnap_ci *r) {
  const Proto *p = clLvalue(s2v(co->stack.p + r->func))->p;
  StkId base = co->stack.p + r->func + 1;
  int at = r->pc - 1;  /* the instruction the frame is suspended in (pc checked >= 1) */
  int q;
  if ((p->flag & PF_VATAB)
      && (r->func + 1 + p->numparams >= r->top || !ttistable(s2v(base + p->numparams))))
    return "a vararg function whose vararg table is not a table";
  for (q = at; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    if (GET_OPCODE(ins) == OP_FORLOOP && q + 1 - GETARG_Bx(ins) <= at) {
      int a = GETARG_A(ins);
      const TValue *count, *step, *ctl;
      if (r->func + 1 + a + 2 >= r->top) return "a numeric for loop outside its frame";
      count = s2v(base + a);
      step = s2v(base + a + 1);
      ctl = s2v(base + a + 2);
      if (ttisinteger(step) ? !(ttisinteger(count) && ttisinteger(ctl))
                            : !(ttisfloat(step) && ttisfloat(count) && ttisfloat(ctl)))
        return "a numeric for loop whose control registers are not the numbers it keeps there";
    }
  }
  return NULL;
}

/* Checks every frame of a suspended coroutine against the instruction (or the C function)
** its caller is suspended in: the callee's function slot and the results it was asked for
** must be exactly those the VM would have used, so that returning, 'luaV_finishOp' and
** 'finishpcall' find the stack as they expect. Invariants, from lvm.c/ldo.c/lbaselib.c of
** 5.5.1:
**   - the first frame is the coroutine's body, at slot 1, called for all results (resume);
**   - a Lua caller at OP_CALL A B C called slot base+A for C-1 results; a Lua callee there
**     runs in the caller's luaV_execute (not fresh);
**   - at OP_TAILCALL A (a C callee: a Lua one replaces the frame) slot base+A, all results;
**   - at OP_TFORCALL A C slot base+A+3 for C results (luaD_call: a fresh Lua callee);
**   - at an instruction that calls a metamethod, the slot at the caller's top ('savestate'
**     sets L->top to ci->top before it), for 1 result (0 for __newindex: luaT_callTM), or for
**     OP_CONCAT A B a slot in base+A+2 .. base+A+B (luaV_concat works down from base+A+B);
**     a Lua callee is fresh;
**   - a C caller is pcall (ctx 0) or xpcall (ctx 2), which call slot func+2 or func+4 for all
**     results and record that slot in u2 (lua_pcallk), and chain the error handler: each
**     saves the previous one and installs none (pcall) or its argument 2 (xpcall);
**   - OP_MMBIN* resumes two instructions in (finishOp reads the one before it).
** Returns NULL or a static message. */
const char *ls_check_call_sites(lua_State *co, const luasnap_ci *cis, int nci, int64_t errfunc,
                                const void *pcall_k, void *memo) {
  int i;
  int64_t handler = -1;  /* the error handler installed by the frames so far */
  int sz = (int)sizeof(StackValue);
  for (i = 0; i < nci; i++) {
    const luasnap_ci *r = &cis[i];
    int wanted = get_nresults(r->callstatus);
    int vf = ls_virtual_func(co, r);
    int callee_lua = !(r->callstatus & CIST_C);
    int fresh = (r->callstatus & CIST_FRESH) != 0;
    if (callee_lua) {
      /* With the load's memo, from the prototype's index (built once per load: linear in
      ** the code and the frames); without one, or for code not as the compiler makes it, by
      ** scanning the code after the resume point (the same answers). */
      const Proto *fp = clLvalue(s2v(co->stack.p + r->func))->p;
      const ls_siteidx *x = memo != NULL ? ls_sites_of(memo, fp) : NULL;
      const char *bad = x != NULL ? ls_sites_check(x, co, r, fp) : NULL;
      if (x == NULL) {
        if (memo != NULL) ls_count_reads(memo, (size_t)(fp->sizecode - r->pc + 1) * 2);
        bad = check_constructor_tables(co, r);
        if (bad == NULL) bad = check_trusted_registers(co, r);
      }
#if defined(LUAI_ASSERT)
      else {  /* the index answers as the scan (builds with Lua's assertions: CI) */
        const char *scan = check_constructor_tables(co, r);
        if (scan == NULL) scan = check_trusted_registers(co, r);
        lua_assert((scan == NULL) == (bad == NULL) && (scan == NULL || strcmp(scan, bad) == 0));
      }
#endif
      if (bad != NULL) return bad;
    }
    if (i == 0) {
      if (vf != 1 || wanted != LUA_MULTRET) return "the first frame is not the coroutine's body";
    }
    else {
      const luasnap_ci *c = &cis[i - 1];
      if (!(c->callstatus & CIST_C)) {
        const Proto *p = clLvalue(s2v(co->stack.p + c->func))->p;
        Instruction ins;
        int ra;
        if (c->pc < 1 || c->pc > p->sizecode) return "a Lua frame resumes outside its code";
        ins = p->code[c->pc - 1];
        ra = c->func + 1 + GETARG_A(ins);
        switch (GET_OPCODE(ins)) {
          case OP_CALL:
            if (vf != ra || wanted != GETARG_C(ins) - 1 || (callee_lua && fresh))
              return "a frame does not match the call its caller is suspended at";
            break;
          case OP_TAILCALL:
            if (vf != ra || wanted != LUA_MULTRET || callee_lua)
              return "a frame does not match the tail call its caller is suspended at";
            break;
          case OP_TFORCALL:
            if (vf != ra + 3 || wanted != GETARG_C(ins) || (callee_lua && !fresh))
              return "a frame does not match the generic-for call its caller is suspended at";
            break;
          case OP_CONCAT:
            if (vf < ra + 2 || vf > ra + GETARG_B(ins) || wanted != 1 || (callee_lua && !fresh))
              return "a frame does not match the concatenation its caller is suspended at";
            break;
          case OP_SETTABUP: case OP_SETTABLE: case OP_SETI: case OP_SETFIELD:
            if (vf != c->top || wanted != 0 || (callee_lua && !fresh))
              return "a frame does not match the metamethod call its caller is suspended at";
            break;
          case OP_LT: case OP_LE: case OP_LTI: case OP_LEI: case OP_GTI: case OP_GEI: case OP_EQ:
            /* finishOp skips or takes the jump that follows */
            if (c->pc >= p->sizecode || GET_OPCODE(p->code[c->pc]) != OP_JMP)
              return "a comparison not followed by its jump";
            goto one_result;
          case OP_MMBIN: case OP_MMBINI: case OP_MMBINK:
            if (c->pc < 2) return "a Lua frame resumes outside its code";
            goto one_result;
          case OP_UNM: case OP_BNOT: case OP_LEN:
          case OP_GETTABUP: case OP_GETTABLE: case OP_GETI: case OP_GETFIELD: case OP_SELF:
          one_result:
            if (vf != c->top || wanted != 1 || (callee_lua && !fresh))
              return "a frame does not match the metamethod call its caller is suspended at";
            break;
          case OP_CLOSE:
            /* luaF_close calls __close of a pending variable at level >= ra with its function
            ** at level + 1 and no results; finishOp repeats OP_CLOSE for the rest. */
            if (vf <= ra || vf > c->top || wanted != 0 || (callee_lua && !fresh))
              return "a frame does not match the __close call its caller is suspended at";
            break;
          case OP_RETURN: {
            /* A return closing variables (k): __close runs above max(frame top, ra + nres);
            ** finishOp sets the top to ra + nres (the saved result count) and repeats the
            ** return. */
            int nres = c->u2;
            int above = ra + nres > c->top ? ra + nres : c->top;
            if (!TESTARG_k(ins) || nres < 0 || vf != above || wanted != 0
                || (callee_lua && !fresh))
              return "a frame does not match the __close call its caller is suspended at";
            break;
          }
          default:
            return "a Lua frame resumes after an instruction that cannot yield";
        }
      }
      else {
        /* A C caller in the middle of the stack: pcall or xpcall (checked by the caller to
        ** have pcall's continuation and CIST_YPCALL). */
        int off = c->ctx == 0 ? 2 : 4;
        if (!(c->callstatus & CIST_YPCALL) || c->k != pcall_k)
          return "an interrupted C frame that is not pcall/xpcall";
        if (vf != c->func + off || wanted != LUA_MULTRET || (callee_lua && !fresh)
            || c->u2 != vf * sz)
          return "a frame does not match the protected call its caller is suspended in";
      }
    }
    if (r->callstatus & CIST_C) {
      if (i < nci - 1) {
        if (!(r->callstatus & CIST_YPCALL) || r->k != pcall_k || (r->ctx != 0 && r->ctx != 2))
          return "an interrupted C frame that is not pcall/xpcall";
        if (r->old_errfunc != handler) return "a protected call saved the wrong error handler";
        handler = r->ctx == 2 ? (int64_t)r->func + 2 : -1;
      }
      else if (r->k != NULL || (r->callstatus & CIST_YPCALL))
        return "the suspended C frame has a continuation";
    }
  }
  if (errfunc != handler) return "the error handler is not the one the frames installed";
  return NULL;
}

/* ----- frame checks by index -----
** check_constructor_tables and check_trusted_registers scan a frame's function from where it
** is suspended to its end: frames x code size per load, which a forged save with thousands of
** frames in one large function (or thousands of coroutines suspended in it) turns into
** seconds. The index answers the same questions per frame in O(registers x log code), built
** once per prototype per load in O(code):
**   - constructors: for each register that some OP_SETLIST writes, the positions of the
**     OP_NEWTABLE and OP_SETLIST instructions with that register (ascending; bit 0 set for a
**     SETLIST). A frame suspended at `at` must hold a table in register a iff the first such
**     instruction at or after `at` is a SETLIST: exactly the scan's rule (a SETLIST whose
**     NEWTABLE for the register is not between `at` and it);
**   - loops: for each register, the bodies [s, q] of the OP_FORLOOPs at q with that register
**     (s = q + 1 - Bx), sorted by s. The compiler gives loops at one level the same register
**     one after another and nested loops other registers, so one register's bodies never
**     overlap; then the loop enclosing `at` for register a, if any, is the last body starting
**     at or before `at`. Invariant checked when building: the bodies of each register are
**     disjoint; otherwise (a binary chunk's code) the index is not used and the frame scan
**     runs, with the same answers. */
struct ls_siteidx {
  int ncreg, nlreg;
  lu_byte creg[256], lreg[256];
  int coff[257], loff[257];
  int *cev;         /* constructors' events: position << 1 | (1 for OP_SETLIST) */
  int64_t *lev;     /* loops: s * 2^32 + q, sorted (s may be negative, q < 2^31) */
};

static int ls_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* Builds p's index (malloc'd); NULL and *oom = 0 when a register's loop bodies overlap, NULL
** and *oom = 1 when out of memory. */
static ls_siteidx *ls_sites_build(const Proto *p, int *oom) {
  int ncnt[256], lcnt[256], fill[256];
  lu_byte setl[256];
  int q, i, nc = 0, nl = 0;
  ls_siteidx *x;
  *oom = 0;
  memset(ncnt, 0, sizeof ncnt);
  memset(lcnt, 0, sizeof lcnt);
  memset(setl, 0, sizeof setl);
  for (q = 0; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    int a = GETARG_A(ins) & 0xff;
    switch (GET_OPCODE(ins)) {
      case OP_NEWTABLE: ncnt[a]++; break;
      case OP_SETLIST: ncnt[a]++; setl[a] = 1; break;
      case OP_FORLOOP:
        if ((int64_t)q + 1 - (int64_t)GETARG_Bx(ins) <= q) { lcnt[a]++; nl++; }  /* a body */
        break;
      default: break;
    }
  }
  for (i = 0; i < 256; i++)
    if (setl[i]) nc += ncnt[i];
  x = (ls_siteidx *)malloc(sizeof *x + (size_t)nl * sizeof(int64_t) + (size_t)nc * sizeof(int));
  if (x == NULL) { *oom = 1; return NULL; }
  x->lev = (int64_t *)(x + 1);
  x->cev = (int *)(x->lev + nl);
  x->ncreg = x->nlreg = 0;
  x->coff[0] = x->loff[0] = 0;
  for (i = 0; i < 256; i++) {
    fill[i] = -1;
    if (setl[i]) {
      x->creg[x->ncreg] = (lu_byte)i;
      x->coff[x->ncreg + 1] = x->coff[x->ncreg] + ncnt[i];
      fill[i] = x->coff[x->ncreg++];
    }
  }
  for (q = 0; q < p->sizecode; q++) {  /* in code order: each register's events ascending */
    Instruction ins = p->code[q];
    OpCode op = GET_OPCODE(ins);
    int a = GETARG_A(ins) & 0xff;
    if ((op == OP_NEWTABLE || op == OP_SETLIST) && fill[a] >= 0)
      x->cev[fill[a]++] = q << 1 | (op == OP_SETLIST);
  }
  for (i = 0; i < 256; i++) {
    fill[i] = -1;
    if (lcnt[i]) {
      x->lreg[x->nlreg] = (lu_byte)i;
      x->loff[x->nlreg + 1] = x->loff[x->nlreg] + lcnt[i];
      fill[i] = x->loff[x->nlreg++];
    }
  }
  for (q = 0; q < p->sizecode; q++) {
    Instruction ins = p->code[q];
    if (GET_OPCODE(ins) == OP_FORLOOP) {
      int64_t start = (int64_t)q + 1 - (int64_t)GETARG_Bx(ins);
      if (start <= q) x->lev[fill[GETARG_A(ins) & 0xff]++] = start * ((int64_t)1 << 32) + q;
    }
  }
  for (i = 0; i < x->nlreg; i++) {
    int64_t *e = x->lev + x->loff[i];
    int j, n = x->loff[i + 1] - x->loff[i];
    qsort(e, (size_t)n, sizeof *e, ls_cmp_i64);
    for (j = 1; j < n; j++)  /* s of the next body after q of this one */
      if ((e[j] >> 32) <= (int32_t)(e[j - 1] & 0xffffffff)) { free(x); return NULL; }
  }
  return x;
}

/* p's index from the load's memo (built on first use), or NULL: out of memory, or p's loops
** not as the compiler makes them (the caller then scans). */
static const ls_siteidx *ls_sites_of(void *memo, const Proto *p) {
  ls_upmemo *m = (ls_upmemo *)memo;
  int xi, oom;
  if (!ls_upget(m, LS_Q_SITES, p, NULL, 0, 0, &xi)) {
    ls_siteidx *nx = ls_sites_build(p, &oom);
    m->reads += (size_t)p->sizecode;
    if (oom) return NULL;
    xi = -1;
    if (nx != NULL) {
      if (m->nsites == m->capsites) {
        size_t cap = m->capsites ? 2 * m->capsites : 16;
        ls_siteidx **g = (cap <= SIZE_MAX / sizeof(*g) && cap <= INT_MAX)
                             ? (ls_siteidx **)realloc(m->sites, cap * sizeof(*g)) : NULL;
        if (g == NULL) {
          free(nx);
          return NULL;
        }
        m->sites = g;
        m->capsites = cap;
      }
      xi = (int)m->nsites;
      m->sites[m->nsites++] = nx;
    }
    if (!ls_upput(m, LS_Q_SITES, p, NULL, 0, 0, xi)) return NULL;
  }
  return xi < 0 ? NULL : m->sites[xi];
}

/* check_constructor_tables, then check_trusted_registers, for the frame r of the function p
** (the same answers, the same message when several apply: for loops, the one of the first
** failing loop in code order, as the scan finds it). */
static const char *ls_sites_check(const ls_siteidx *x, lua_State *co, const luasnap_ci *r,
                                  const Proto *p) {
  StkId base = co->stack.p + r->func + 1;
  int at = r->pc - 1;  /* the instruction the frame is suspended in (pc checked >= 1) */
  int i, bestq = INT_MAX;
  const char *best = NULL;
  for (i = 0; i < x->ncreg; i++) {
    const int *e = x->cev + x->coff[i];
    int lo = 0, hi = x->coff[i + 1] - x->coff[i];
    int n = hi, a = x->creg[i];
    while (lo < hi) {  /* the first event at or after at */
      int mid = lo + (hi - lo) / 2;
      if ((e[mid] >> 1) < at) lo = mid + 1;
      else hi = mid;
    }
    if (lo < n && (e[lo] & 1)
        && (r->func + 1 + a >= r->top || !ttistable(s2v(base + a))))
      return "a table constructor whose table is not a table";
  }
  if ((p->flag & PF_VATAB)
      && (r->func + 1 + p->numparams >= r->top || !ttistable(s2v(base + p->numparams))))
    return "a vararg function whose vararg table is not a table";
  for (i = 0; i < x->nlreg; i++) {
    const int64_t *e = x->lev + x->loff[i];
    int lo = 0, hi = x->loff[i + 1] - x->loff[i];
    int a = x->lreg[i], q;
    const char *bad = NULL;
    while (lo < hi) {  /* the first body starting after at */
      int mid = lo + (hi - lo) / 2;
      if ((e[mid] >> 32) <= at) lo = mid + 1;
      else hi = mid;
    }
    if (lo == 0) continue;
    q = (int)(e[lo - 1] & 0xffffffff);
    if (q < at) continue;  /* the last body starting at or before at ends before it */
    if (r->func + 1 + a + 2 >= r->top) bad = "a numeric for loop outside its frame";
    else {
      const TValue *count = s2v(base + a), *step = s2v(base + a + 1), *ctl = s2v(base + a + 2);
      if (ttisinteger(step) ? !(ttisinteger(count) && ttisinteger(ctl))
                            : !(ttisfloat(step) && ttisfloat(count) && ttisfloat(ctl)))
        bad = "a numeric for loop whose control registers are not the numbers it keeps there";
    }
    if (bad != NULL && q < bestq) { bestq = q; best = bad; }
  }
  return best;
}
