/*
** The string table's keyed hash (Lua patch 9, lstring.c).
**
** Lua interns every short string in one hash table (global_State.strt), chained by the
** string's hash, which is a public function of its bytes and the state's seed (luaS_hash).
** A save-game can carry the seed (a table layout holds it), and the deterministic profile
** fixes it (luasnap diff uses 0, simulate its --seed): strings chosen to share the low bits of
** that hash land in one chain, and interning each walks it. 100K such 8-byte strings took
** `luasnap diff` 19.7 s (0.05 s for random ones), and the chain stays long for everything
** interned after.
**
** So the chains are chosen by another hash: SipHash-1-3 (Rust's HashMap's, made for exactly
** this) of the bytes, keyed by 128 random bits drawn once per process. No save, arena byte or
** behaviour of Lua shows it: table layouts, pairs order and every TString's own hash stay the
** seeded luaS_hash (the deterministic profile's guarantees are about those), and the chain a
** string sits in changes only which strings an intern compares it with. In one process every
** VM has the same key, so two VMs built alike still have the same bytes.
*/
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include "lsint.h"
#include "strkey.h"

static uint64_t ls_strkey[2];
static pthread_once_t ls_strkey_once = PTHREAD_ONCE_INIT;

static void ls_strkey_draw(void) {
  uint64_t k[2];
  size_t got = 0;
  while (got < sizeof k) {
    ssize_t n = getrandom((char *)k + got, sizeof k - got, 0);
    if (n <= 0) break;
    got += (size_t)n;
  }
  if (got < sizeof k) {
    /* No getrandom: /dev/urandom, else the clock and addresses (as luai_makeseed). */
    FILE *f = fopen("/dev/urandom", "rb");
    if (f == NULL || fread(k, 1, sizeof k, f) != sizeof k) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      k[0] = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)&ts;
      k[1] = (uint64_t)(uintptr_t)&ls_strkey ^ ((uint64_t)(uintptr_t)f << 17) ^ 0x9e3779b97f4a7c15ULL;
    }
    if (f != NULL) fclose(f);
  }
  ls_strkey[0] = k[0];
  ls_strkey[1] = k[1];
}

void ls_strkey_init(void) {
  pthread_once(&ls_strkey_once, ls_strkey_draw);
}

#define LS_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define LS_SIPROUND \
  do { \
    v0 += v1; v1 = LS_ROTL(v1, 13); v1 ^= v0; v0 = LS_ROTL(v0, 32); \
    v2 += v3; v3 = LS_ROTL(v3, 16); v3 ^= v2; \
    v0 += v3; v3 = LS_ROTL(v3, 21); v3 ^= v0; \
    v2 += v1; v1 = LS_ROTL(v1, 17); v1 ^= v2; v2 = LS_ROTL(v2, 32); \
  } while (0)

/* SipHash-1-3 of str[0..l) under the process's key (as the reference implementation, one
** compression round per 8-byte word and three finalization rounds), folded to 32 bits. */
unsigned int ls_strkey_hash(const char *str, size_t l) {
  uint64_t v0 = 0x736f6d6570736575ULL ^ ls_strkey[0];
  uint64_t v1 = 0x646f72616e646f6dULL ^ ls_strkey[1];
  uint64_t v2 = 0x6c7967656e657261ULL ^ ls_strkey[0];
  uint64_t v3 = 0x7465646279746573ULL ^ ls_strkey[1];
  const unsigned char *p = (const unsigned char *)str;
  uint64_t m, b = (uint64_t)l << 56;
  size_t left = l;
  while (left >= 8) {
    memcpy(&m, p, 8);  /* little-endian words on the hosts luasnap runs on */
    v3 ^= m; LS_SIPROUND; v0 ^= m;
    p += 8; left -= 8;
  }
  m = 0;
  memcpy(&m, p, left);
  b |= m;
  v3 ^= b; LS_SIPROUND; v0 ^= b;
  v2 ^= 0xff;
  LS_SIPROUND; LS_SIPROUND; LS_SIPROUND;
  m = v0 ^ v1 ^ v2 ^ v3;
  return (unsigned int)(m ^ (m >> 32));
}

/* The length of the longest chain in the string table (for tests). */
int luasnap_strtab_longest_chain(lua_State *L) {
  const stringtable *tb = &G(L)->strt;
  int i, longest = 0;
  for (i = 0; i < tb->size; i++) {
    int n = 0;
    const TString *ts;
    for (ts = tb->hash[i]; ts != NULL; ts = ts->u.hnext) n++;
    if (n > longest) longest = n;
  }
  return longest;
}
