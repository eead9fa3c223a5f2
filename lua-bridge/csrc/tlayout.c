/*
** The order of a hash part's live keys in a saved layout (see tlayout.h): tag, then value.
*/
#include "tlayout.h"

/* An order on layout keys (tag, then value; strings by length, then bytes; objects and light
** C functions by identity): total on numbers, booleans and strings; see ls_ties. */
static int keycmp(const Node *a, const Node *b) {
  int ta = keytt(a), tb = keytt(b);
  if (ta != tb) return ta < tb ? -1 : 1;
  switch (ta) {
    case LUA_VNUMINT: {
      lua_Integer x = keyival(a), y = keyival(b);
      return x < y ? -1 : x > y;
    }
    case LUA_VNUMFLT: {
      lua_Number x = fltvalueraw(keyval(a)), y = fltvalueraw(keyval(b));
      return x < y ? -1 : x > y;  /* never NaN: NaN is not a key */
    }
    case ctb(LUA_VSHRSTR): case ctb(LUA_VLNGSTR): {
      TString *x = keystrval(a), *y = keystrval(b);
      size_t lx = tsslen(x), ly = tsslen(y);
      if (lx != ly) return lx < ly ? -1 : 1;
      return memcmp(getstr(x), getstr(y), lx);
    }
    case LUA_VLCF: {
      unsigned int x = luasnap_cfunction_id(fvalueraw(keyval(a)));
      unsigned int y = luasnap_cfunction_id(fvalueraw(keyval(b)));
      return x < y ? -1 : x > y;
    }
    case ctb(LUA_VTABLE): case ctb(LUA_VLCL): case ctb(LUA_VCCL):
    case ctb(LUA_VUSERDATA): case ctb(LUA_VTHREAD): {
      unsigned int x = gcoid(gcvalueraw(keyval(a))), y = gcoid(gcvalueraw(keyval(b)));
      return x < y ? -1 : x > y;  /* by identity (see ls_ties) */
    }
    default:
      return 0;  /* booleans: the tag decides */
  }
}

int ls_ties(const Table *t, const uint32_t *idx, unsigned int n) {
  unsigned int i;
  for (i = 1; i < n; i++)
    if (keycmp(gnode(t, idx[i - 1]), gnode(t, idx[i])) == 0) return 1;
  return 0;
}

/* Sorts idx[0..n) (node indices of t) by keycmp: insertion sort for a few, else heap sort
** (no recursion, no allocation). Without ties (ls_ties) every correct sort gives the same
** order: saver and loader need not sort alike. */
void ls_sort_nodes(const Table *t, uint32_t *idx, unsigned int n) {
  unsigned int i, end;
#define NLT(a, b) (keycmp(gnode(t, idx[a]), gnode(t, idx[b])) < 0)
#define SIFT(start, stop) do { \
    unsigned int r_ = (start); \
    for (;;) { \
      unsigned int c_ = 2 * r_ + 1; \
      uint32_t tmp_; \
      if (c_ >= (stop)) break; \
      if (c_ + 1 < (stop) && NLT(c_, c_ + 1)) c_++; \
      if (!NLT(r_, c_)) break; \
      tmp_ = idx[r_]; idx[r_] = idx[c_]; idx[c_] = tmp_; r_ = c_; \
    } } while (0)
  if (n < 2) return;
  if (n <= 16) {  /* small (most tables): insertion sort makes fewer comparisons */
    for (i = 1; i < n; i++) {
      uint32_t x = idx[i];
      unsigned int j = i;
      while (j > 0 && keycmp(gnode(t, x), gnode(t, idx[j - 1])) < 0) {
        idx[j] = idx[j - 1];
        j--;
      }
      idx[j] = x;
    }
    return;
  }
  for (i = n / 2; i-- > 0;) SIFT(i, n);
  for (end = n - 1; end > 0; end--) {
    uint32_t tmp = idx[0]; idx[0] = idx[end]; idx[end] = tmp;
    SIFT(0, end);
  }
#undef SIFT
#undef NLT
}
