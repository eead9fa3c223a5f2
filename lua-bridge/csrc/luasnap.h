/*
** luasnap.h: the C helpers' interface to Rust, and the only one.
**
** The helpers in lua-bridge/csrc reach into Lua 5.5.1's internals (stacks, tables, prototypes,
** coroutines) for what the public C API cannot do: snapshots whose arena bytes depend on the
** Lua state alone, and the save-game serializer. Every function Rust calls is declared here,
** with the structures and constants both sides share; lua-bridge/src/bridge/helpers.rs is its
** Rust side, one declaration for each. Each .c file includes this header (build.rs compiles
** them with -Werror=missing-prototypes, so an exported function without a prototype here
** fails the build).
**
** Names: `luasnap_*` is this interface; `ls_*` is shared between helper files only (declared in
** the internal header of the file that defines it: proto.h, chunks.h, tlayout.h, loadmemo.h,
** framecheck.h) or static. Files depend on each other one way, no circle:
**   proto <- chunks <- loaders, state;  tlayout <- tscan;  tlayout, proto <- tbuild;
**   loadmemo <- framecheck <- coload;  loadmemo <- upvalcheck;  canonical <- corolib;
**   cfids (compiled into the Lua library) <- tlayout, ident;
**   coframes, readline, detsort, budget stand alone.
**
** Raising: a function marked LUASNAP_RAISES may raise a Lua error (a longjmp to the innermost
** protected call; out of memory at least) and Rust declares it `extern "C-unwind"`; the others
** never raise and Rust declares them `extern "C"`. The Rust module's tests check both, and
** every signature, against this file.
**
** Shared structures are checked on both sides at build time: the LUASNAP_MIRROR and
** LUASNAP_FIELD lines below are C _Static_asserts here, and build.rs turns the same lines into
** Rust const assertions on the mirror they name (size, and each field's offset and size). The
** kinds (LS_*) and the LUASNAP_* numbers are likewise generated into Rust from this file.
*/
#ifndef LUASNAP_H
#define LUASNAP_H

#include <stddef.h>
#include <stdint.h>

#include "lua.h"

/* Marks a function that may raise a Lua error (see above). */
#define LUASNAP_RAISES

/* One size and layout for every shared structure: 64-bit targets (the arena's fixed addresses
** need a 64-bit address space anyway). */
_Static_assert(sizeof(void *) == 8 && sizeof(size_t) == 8, "luasnap needs a 64-bit target");

#define LUASNAP_MIRROR(ctype, rusttype, size) \
  _Static_assert(sizeof(ctype) == (size), #ctype " changed size: update " #rusttype " in helpers.rs and this line")
#define LUASNAP_FIELD(ctype, field, offset, size) \
  _Static_assert(offsetof(ctype, field) == (offset) && sizeof(((ctype *)0)->field) == (size), \
                 #ctype "." #field " moved or changed size: update its Rust mirror and this line")

/* Called for each prototype of a walk: f(p, ud). */
typedef void (*luasnap_proto_fn)(const void *p, void *ud);
/* Called for each Lua closure of a walk: f(closure, its prototype, ud). */
typedef void (*luasnap_closure_fn)(const void *cl, const void *p, void *ud);

/* ===================== Kinds of a value =====================
** luasnap_val.kind (the scan's and the build steps' values) and luasnap_sentry.kkind, .vkind.
** build.rs generates Rust's `helpers::kind` constants from the `#define LS_<NAME> <n>` lines
** below, each with the comment just above it as its doc: change them here only. */

/* false. */
#define LS_FALSE 1
/* true. */
#define LS_TRUE 2
/* An integer: `bits` is its value. */
#define LS_INT 3
/* A float: `bits` holds its IEEE-754 bits. */
#define LS_FLOAT 4
/* A string: `s` and `len` its bytes. Scan: `bits` is its identity (the TString). Build: its
** string id + 1, or 0 if it gets none. */
#define LS_STR 5
/* Build only: `bits` is a string id + 1. */
#define LS_STRREF 6
/* Build only: `bits` is an object id (`len`: the body position, for errors). */
#define LS_REF 7
/* Scan only: an object, `bits` its identity (as lua_topointer gives it). */
#define LS_OBJ 8
/* Scan only: a value the general path must handle (a light userdata). */
#define LS_OTHER 9
/* Build: push nil. Scan: a nil upvalue (table entries are never nil). */
#define LS_NIL 10
/* Build only: push a new table, `bits` its object id, `len` its array size << 32 | its hash
** size. */
#define LS_NEWTABLE 11
/* Build only: `[t, mt]`: set t's metatable (`len`: the body position, for errors). */
#define LS_META 12
/* Build only: `[t, k, v]`: `t[k] = v`. */
#define LS_SET 13
/* Scan only: a table, `bits` its identity (the Table itself). */
#define LS_TABLE 14
/* Build only: push a new Lua closure of the prototype `bits`, object id `len`. */
#define LS_NEWCLOSURE 15
/* Build only: `[f, v]`: upvalue `bits` of f = v. */
#define LS_SETUPVAL 16
/* Build only: `[f]`: upvalue `len >> 32` of f is upvalue `len & 0xffffffff` of the Lua closure
** with object id `bits`. */
#define LS_JOINUPVAL 17
/* Scan only: a Lua closure, `bits` its identity. */
#define LS_LCLOSURE 18
/* Build only: `[t]`: t's hash part takes the layout at offset `bits` of the batch's layout
** buffers (`len`: the body position, for errors). */
#define LS_LAYOUT 19
/* Build only: as `NEWTABLE`, for a table whose `LAYOUT` step follows in the same batch, with
** the node count and hash seed of the table: its entries go into its nodes in order, unhashed,
** until that step places them. */
#define LS_NEWTABLE_PLACED 20
/* Build only: `[t]`: `t[k] = v`, with `SETKV | vkind << 8 | kkind << 16 | kval << 32` the kind:
** the key `kval` (an integer; for `STRREF`, a string id + 1), the value as a step of kind
** `vkind` (a boolean, number or string) would carry it. */
#define LS_SETKV 21

/* Numbers Rust sizes its side by (generated into Rust as `helpers::<NAME>: usize`). */

/* Entries of a layout cache (luasnap_table_layout's `way` is below twice this). */
#define LUASNAP_LAYOUT_WAYS 64
/* How deep tables may nest in one luasnap_table_build program, the table it starts on
** counted (the loader's batches nest at most PLAIN_DEPTH, 16). */
#define LUASNAP_BUILD_DEPTH 18

/* ===================== Shared structures ===================== */

/* A value as the table helpers describe it (Rust: RawVal). */
typedef struct luasnap_val {
  uint64_t kind;   /* an LS_* kind (a whole word: copies move whole words) */
  uint64_t len;    /* a string's length, or as the kind says */
  uint64_t bits;   /* the integer, the float's bits, an identity or an id */
  const char *s;   /* a string's bytes */
} luasnap_val;
LUASNAP_MIRROR(luasnap_val, RawVal, 32);
LUASNAP_FIELD(luasnap_val, kind, 0, 8);
LUASNAP_FIELD(luasnap_val, len, 8, 8);
LUASNAP_FIELD(luasnap_val, bits, 16, 8);
LUASNAP_FIELD(luasnap_val, s, 24, 8);

/* A table entry for the writer's scan (Rust: ScanEntry): each side's kind (an LS_* scan kind)
** and bits (the integer, the float's bits, or the identity: a string's TString; 0 for nil and
** booleans). No string bytes: the writer refers to a string written before by its identity
** alone, and asks luasnap_string_bytes for the few it writes whole. */
typedef struct luasnap_sentry {
  uint64_t kbits, vbits;
  uint32_t pos;   /* the position just after this entry */
  uint8_t kkind, vkind;
} luasnap_sentry;
LUASNAP_MIRROR(luasnap_sentry, ScanEntry, 24);
LUASNAP_FIELD(luasnap_sentry, kbits, 0, 8);
LUASNAP_FIELD(luasnap_sentry, vbits, 8, 8);
LUASNAP_FIELD(luasnap_sentry, pos, 16, 4);
LUASNAP_FIELD(luasnap_sentry, kkind, 20, 1);
LUASNAP_FIELD(luasnap_sentry, vkind, 21, 1);

/* One call frame of a suspended coroutine, in stack-slot offsets (Rust: CiRecord). */
typedef struct luasnap_ci {
  int32_t func, top;         /* slot offsets from the stack base */
  uint32_t callstatus;
  int32_t u2;                /* nyield / nres / funcidx */
  int32_t pc;                /* Lua: index of the next instruction */
  int32_t nextraargs;        /* Lua: extra arguments of a vararg function */
  int64_t old_errfunc;       /* C: saved error function, slot offset (or -1) */
  int64_t ctx;               /* C: continuation context */
  const void *k;             /* C: continuation (a C function pointer) or NULL */
} luasnap_ci;
LUASNAP_MIRROR(luasnap_ci, CiRecord, 48);
LUASNAP_FIELD(luasnap_ci, func, 0, 4);
LUASNAP_FIELD(luasnap_ci, top, 4, 4);
LUASNAP_FIELD(luasnap_ci, callstatus, 8, 4);
LUASNAP_FIELD(luasnap_ci, u2, 12, 4);
LUASNAP_FIELD(luasnap_ci, pc, 16, 4);
LUASNAP_FIELD(luasnap_ci, nextraargs, 20, 4);
LUASNAP_FIELD(luasnap_ci, old_errfunc, 24, 8);
LUASNAP_FIELD(luasnap_ci, ctx, 32, 8);
LUASNAP_FIELD(luasnap_ci, k, 40, 8);

/* What the writer needs of a prototype's chunk (Rust: ChunkDesc). The pointers stay valid while
** the prototype is alive. */
typedef struct luasnap_chunk_desc {
  const void *rec;   /* the record: identifies the chunk (its text) */
  const void *main;  /* the main prototype of the record's first tree */
  const char *src;   /* the source text (or binary chunk) the compiler read */
  size_t srclen;
  const char *name;  /* the chunk name (NULL if the tree has none) */
  size_t namelen;
} luasnap_chunk_desc;
LUASNAP_MIRROR(luasnap_chunk_desc, ChunkDesc, 48);
LUASNAP_FIELD(luasnap_chunk_desc, rec, 0, 8);
LUASNAP_FIELD(luasnap_chunk_desc, main, 8, 8);
LUASNAP_FIELD(luasnap_chunk_desc, src, 16, 8);
LUASNAP_FIELD(luasnap_chunk_desc, srclen, 24, 8);
LUASNAP_FIELD(luasnap_chunk_desc, name, 32, 8);
LUASNAP_FIELD(luasnap_chunk_desc, namelen, 40, 8);

/* ===================== proto.c: prototypes and their fingerprints =====================
** A prototype is passed as an opaque `const void *` (a live Proto). */

/* The prototype of the Lua closure at idx, or NULL if it is not a Lua closure. */
const void *luasnap_proto(lua_State *L, int idx);
/* The light C function at idx (a C function without upvalues, not a closure), or NULL. */
lua_CFunction luasnap_light_cfunction(lua_State *L, int idx);
/* Its number of upvalues. */
int luasnap_proto_nupvalues(const void *p);
/* The name of upvalue i (1-based) of prototype p (its debug information) and its length in
** *len, or NULL (no such upvalue, or no name: a stripped function). */
const char *luasnap_proto_upvalue_name(const void *p, int i, size_t *len);
/* Its number of nested prototypes, and child i of them (NULL when there is no such child). */
int luasnap_proto_nchildren(const void *p);
const void *luasnap_proto_child(const void *p, int i);
/* Its structural fingerprint: how saves name functions. */
uint64_t luasnap_proto_hash(const void *p);
/* The fingerprint it would have with every line of its tree moved by shift. */
uint64_t luasnap_proto_hash_shifted(const void *p, int64_t shift);
/* The line it was defined at. */
int luasnap_proto_line(const void *p);
/* Whether a and b are the same code but for lines (what a frame suspended in a needs to resume
** in b), nested functions compared by number only. Reads only. */
int luasnap_proto_same_code(const void *a, const void *b);
/* Clears PF_LSDONE over p's tree (a tree compiled only to be compared): luasnap_each_proto
** then never offers it. */
void luasnap_proto_tree_retire(const void *p);
/* The fingerprints of p and every prototype nested in it, pre-order, into hs[0..max); returns
** how many prototypes the tree has, or -1 if it nests too deep (then hash each alone). */
int luasnap_proto_tree_hashes(const void *p, uint64_t *hs, int max);
/* Pushes a new closure of p with fresh (nil) upvalues. */
LUASNAP_RAISES void luasnap_push_closure(lua_State *L, const void *p);
/* Calls f(p, ud) for every prototype alive in the VM; the collector must be stopped. */
void luasnap_each_proto(lua_State *L, luasnap_proto_fn f, void *ud);
/* Calls f(q, ud) for p and every prototype nested in it. */
void luasnap_proto_tree(const void *p, luasnap_proto_fn f, void *ud);
/* Places (how a newer version of a chunk finds the same function): the pc of the OP_CLOSURE
** making each of p's first n children into pcs (-1: none makes it); the name p gives the
** function made at pc, into buf[0..cap) (returns its length; 0: anonymous). (Upvalue names:
** luasnap_proto_upvalue_name above.) */
void luasnap_proto_closure_pcs(const void *p, int *pcs, int n);
int luasnap_proto_child_name(const void *p, int pc, char *buf, int cap);
/* Where upvalue i of p comes from in the enclosing function: returns the index of its upvalue
** (*local 0) or its register (*local 1); -1 for no such upvalue. */
int luasnap_proto_upvalue_desc(const void *p, int i, int *local);
/* Closures bound to another version of their function, whose extra upvalue slots hold the
** saved version's upvalues during a load (see proto.c). A closure of p with n upvalue slots
** (0: bad n, nothing pushed); set the upvalue in a slot from the value on top (popped);
** share another closure's slot; whether a slot is closed; rebind the closure at idx to p in
** place, upvalue j from slot from[j] (-1: fresh). Slots are 0-based; each returns 0 for a
** slot or closure that does not exist. */
LUASNAP_RAISES int luasnap_push_closure_n(lua_State *L, const void *p, int n);
int luasnap_upval_set_slot(lua_State *L, int idx, int slot);
int luasnap_upval_join_slot(lua_State *L, int aidx, int aslot, int bidx, int bslot);
int luasnap_upval_closed_slot(lua_State *L, int idx, int slot);
LUASNAP_RAISES int luasnap_closure_rebind(lua_State *L, int idx, const void *p, const int *from);
/* Once a load is over: the slots of the closure at idx past its prototype's upvalue count share
** one upvalue, releasing the saved version's values (0: not a Lua closure). */
LUASNAP_RAISES int luasnap_closure_trim(lua_State *L, int idx);
/* Calls f(closure, proto, ud) for every Lua closure alive; the collector must be stopped. Pushes
** such a closure (no Lua code run since the walk). */
void luasnap_each_lclosure(lua_State *L, luasnap_closure_fn f, void *ud);
void luasnap_push_lclosure(lua_State *L, const void *cl);

/* ===================== chunks.c: the chunk registry ===================== */

/* luaL_loadbufferx of the string at idx, registering the chunk with that string as its source
** text; returns the lua_load status (the function or the message on top). */
LUASNAP_RAISES int luasnap_loadstring(lua_State *L, int idx, const char *chunkname,
                                      const char *mode);
/* luasnap_loadstring in text mode, the chunk's record marked as compiled from a save-game's
** text by a foreign load. */
LUASNAP_RAISES int luasnap_loadstring_from_save(lua_State *L, int idx, const char *chunkname);
/* lua_dump of the Lua function on top, written without the chunk record's anchor. */
LUASNAP_RAISES int luasnap_dump(lua_State *L, lua_Writer writer, void *data, int strip);
/* Calls f(p, ud) for every prototype of the chunks in the registry table. Does not allocate;
** the collector must be stopped. */
LUASNAP_RAISES void luasnap_chunks_each_proto(lua_State *L, luasnap_proto_fn f, void *ud);
/* Keeps the record of the chunk whose main closure is at fnidx for the VM's life (the host's
** own code: saves find its functions even after the game dropped them). */
LUASNAP_RAISES void luasnap_chunk_keep(lua_State *L, int fnidx);
/* The main prototype of the chunk the host last kept under this chunk name (its current
** version), its main closure pushed; NULL, nothing pushed, if there is none. */
LUASNAP_RAISES const void *luasnap_chunk_current(lua_State *L, const char *name, size_t namelen);
/* Describes the chunk of prototype p into *out; 0 if p has no chunk record. */
int luasnap_chunk_describe(const void *p, luasnap_chunk_desc *out);
/* The main prototype of a live chunk with this fingerprint, source text and chunk name, or
** NULL. Leaves the stack as it was. */
LUASNAP_RAISES const void *luasnap_chunk_find(lua_State *L, uint64_t print, const char *src,
                                              size_t srclen, const char *name, size_t namelen);

/* ===================== loaders.c: the registering loaders (copies of Lua's) ===================== */

/* luaL_loadfilex, registering the chunk it compiles (filename NULL: stdin). */
LUASNAP_RAISES int luasnap_loadfilex(lua_State *L, const char *filename, const char *mode);
/* Replaces load, loadfile, dofile, string.dump and package.searchers[2] of the open libraries
** with the registering versions. */
LUASNAP_RAISES void luasnap_chunks_install(lua_State *L);
/* The deterministic profile's require, in two steps around the host's lookup
** (bridge/modules.rs): whether package.loaded[name] answers (pushed, 1); then the module
** path/src loaded as the chunk "@path" and run as stock require does (path NULL: not found,
** or, with src not NULL, unreadable for the reason src says). */
LUASNAP_RAISES int luasnap_require_loaded(lua_State *L);
LUASNAP_RAISES int luasnap_require_load(lua_State *L, const char *path, size_t pathlen,
                                        const char *src, size_t srclen);

/* ===================== coframes.c: a suspended coroutine, read for the writer ===================== */

/* Stack size (slots, slot 0 included), frames above base_ci, whether a to-be-closed variable
** is pending, and errfunc as a slot offset (-1: none). */
void luasnap_thread_info(lua_State *co, int *stacksize, int *nci, int *tbc, int64_t *errfunc);
/* Pushes slot i of co's stack onto L (the caller guarantees room). */
void luasnap_thread_push_slot(lua_State *L, lua_State *co, int i);
/* The first n frames above base_ci, in one walk. */
void luasnap_thread_cis(lua_State *co, luasnap_ci *out, int n);
/* The continuation of the frame above base_ci + level (NULL for a Lua frame or none). */
const void *luasnap_thread_k(lua_State *co, int level);
/* If upvalue n (1-based) of the Lua closure at idx is open, returns 1 with its thread and
** stack level; else 0. */
int luasnap_upval_open(lua_State *L, int idx, int n, lua_State **owner, int *level);
/* Up to max stack offsets of co's pending to-be-closed variables, oldest first; returns how
** many there are. */
int luasnap_thread_tbc(lua_State *co, int32_t *out, int max);
/* co's frames (CallInfo pointers, the first above base_ci first) into out[0..max); returns
** their number. */
int luasnap_thread_frames(lua_State *co, const void **out, int max);

/* ===================== coload.c: building a loaded coroutine ===================== */

/* Pops the value on top of L into slot i (>= 1) of co, growing co's stack; -1 if slot i is
** beyond the largest stack Lua allows. Raises on L, never on co. */
LUASNAP_RAISES int luasnap_thread_put(lua_State *L, lua_State *co, int i);
/* Makes upvalue n of the Lua closure at idx the open upvalue of co's slot `level` (the open
** upvalue an of the closure at aidx, 0: none, being the next one above); the upvalue, or NULL
** if the arguments are invalid. Raises on L, never on co. */
LUASNAP_RAISES void *luasnap_upval_join_at(lua_State *L, int idx, int n, lua_State *co, int level,
                                           int aidx, int an);
/* Whether upvalue n of the Lua closure at idx exists and is closed (may be shared). */
int luasnap_upval_shareable(lua_State *L, int idx, int n);
/* The Lua closure in stack slot `slot` of co (as a frame record's func), or NULL. */
const void *luasnap_thread_slot_lclosure(lua_State *co, int slot);
/* Rebuilds and checks the frames of a suspended coroutine whose stack values are in place;
** NULL, or why they are refused (a static message). */
const char *luasnap_thread_restore(lua_State *L, lua_State *co, const luasnap_ci *cis, int nci,
                                   int64_t errfunc, const void *const *known_k, int nknown,
                                   const void *pcall_k, void *memo);
/* Marks (on != 0) a coroutine as being built, or ends the mark (-1: Lua code reset it). */
int luasnap_thread_building(lua_State *co, int on);
/* Holds (on != 0) a restored coroutine unresumable, or releases it suspended (-1: reset). */
int luasnap_thread_hold(lua_State *co, int on);
/* Rebuilds co's to-be-closed list from n stack offsets, oldest first; NULL or why not. */
const char *luasnap_thread_set_tbc(lua_State *co, const int32_t *slots, int n);

/* ===================== upvalcheck.c, loadmemo.c: open upvalues of loaded coroutines ===================== */

/* Whether the Lua closure at idx may have its upvalue n open at slot `level` of the loaded
** coroutine co, whose frames are frames[0..nframes); NULL or why not. `memo`: the load's
** (luasnap_upmemo_size bytes, zeroed first, luasnap_upmemo_free at the end). */
const char *luasnap_open_upval_check(lua_State *L, int idx, int n, lua_State *co, int level,
                                     const void *const *frames, int nframes, int strict,
                                     void *memo);
/* Bytes of a load's memo for the coroutine checks; zeroed bytes are an empty memo. */
size_t luasnap_upmemo_size(void);
/* Frees what the memo holds and zeroes it. */
void luasnap_upmemo_free(void *memo);
/* Work counters of the memo's load, for tests: prototype-tree walks, instructions read. */
size_t luasnap_upmemo_walks(const void *memo);
size_t luasnap_upmemo_reads(const void *memo);

/* ===================== tscan.c: tables and closures, read for the writer ===================== */

/* Pushes the value, then the key, of the first entry at position >= *pos of the table tp and
** sets *pos past it; 0 (nothing pushed) after the last. Room for 2 values guaranteed. */
int luasnap_table_next(lua_State *L, const void *tp, uint32_t *pos);
/* Pushes the key (what 0) or value (what 1) of the entry at position pos; 0 if none. */
int luasnap_table_entry(lua_State *L, const void *tp, uint32_t pos, int what);
/* Describes up to max entries of tp from position pos on into out; returns how many. */
int luasnap_table_scan(lua_State *L, const void *tp, uint32_t pos, luasnap_sentry *out, int max);
/* The bytes and length of the string ts (a live TString, as a scan gave its identity). */
const char *luasnap_string_bytes(const void *ts, size_t *len);
/* Sizes of tp's array and hash parts and its metatable; whether that has a field `key`. */
int luasnap_table_info(const void *tp, const void *key, uint32_t *narr, uint32_t *nhash,
                       const void **mt);
/* Whether the table mt has a non-nil field `key` (a live string). */
int luasnap_meta_has(const void *mt, const void *key);
/* Pushes the metatable of the table tp, or nil. */
void luasnap_push_metatable(lua_State *L, const void *tp);
/* Stores the objects ps[0..n) at tbl[keys[i]] (or tbl[first + i] if keys is NULL), tbl being
** the table at the absolute index idx. */
LUASNAP_RAISES void luasnap_anchor(lua_State *L, int idx, const void *const *ps,
                                   const lua_Integer *keys, int n, lua_Integer first);
/* The prototype of the Lua closure f and its n (<= max) closed upvalues' identities and
** values; n, or -1 if more than max or one is open. */
int luasnap_closure_scan(const void *f, const void **proto, const void **uids, luasnap_val *vals,
                         int max);
/* The layout of tp's hash part (see tscan.c); its node count, or 0 for none to save. */
uint32_t luasnap_table_layout(lua_State *L, const void *tp, uint32_t *codes, int32_t *nexts,
                              uint32_t *idx, uint32_t cap, uint32_t *lastfree, uint32_t *seed,
                              void *cache, uint32_t *nodes, int *way, uint64_t kept);
/* Bytes of a layout cache (zeroed: empty), and forgetting all it holds. */
size_t luasnap_layout_cache_size(void);
void luasnap_layout_cache_reset(void *cache);
/* Describes the key of node i of the table tp (a removed entry's: layout code 2). */
void luasnap_node_key(lua_State *L, const void *tp, uint32_t i, luasnap_val *out);
/* Kinds of a removed entry's key a layout writes as code 1 (luasnap_table_removed_keys). */
#define LS_RK_DEAD 0   /* cleared by the collector: an address only */
#define LS_RK_OBJ 1    /* an object not cleared yet */
#define LS_RK_CFUNC 2  /* a light C function */
/* The removed entries of tp whose keys a layout writes as code 1: node, identity, kind; the
** count (fills at most cap). */
uint32_t luasnap_table_removed_keys(const void *tp, uint32_t *nodes, const void **ptrs,
                                    uint8_t *kinds, uint32_t cap);
/* Pushes the key of node i of tp, a removed entry's of kind LS_RK_CFUNC. */
void luasnap_push_node_key(lua_State *L, const void *tp, uint32_t i);

/* ===================== tbuild.c: tables and closures, built for the loader ===================== */

/* Runs n building steps (see tbuild.c) on the table on top; -1, or the index of the step that
** failed (-2 - i: step i set a metatable with __gc under LS_BUILD_NOFINAL). finals: the flags
** below. */
#define LS_BUILD_NOFINAL 1   /* a metatable with __gc fails the step */
#define LS_BUILD_UNMARKED 2  /* setting a metatable marks nothing for finalization */
LUASNAP_RAISES int luasnap_table_build(lua_State *L, int strs, int objs, const luasnap_val *ops,
                                       int n, int finals, const uint32_t *lay,
                                       const int32_t *laynx, void *scratch, void *memo);
/* Puts the entries of the table at idx into the nodes of a saved layout; 0 done, 1 does not
** apply (another seed or size), -1 inconsistent (the table left as it was). */
int luasnap_table_relayout(lua_State *L, int idx, const uint32_t *codes, const int32_t *nexts,
                           uint32_t size, uint32_t lastfree, uint32_t seed, int keys,
                           void *scratch, void *memo);
/* The node count of the table at idx (0 for the dummy node). */
uint32_t luasnap_table_nodes(lua_State *L, int idx);
/* Gives node `node` of the table at tidx, a removed entry a layout placed as code 1 (a dead
** key with no identity), the key at kidx again: dead (an identity only) or not; 0 done, 1 the
** node is no such entry or a lookup of the key would not stop there alone (nothing changed),
** -1 a key of a kind no such entry has. */
int luasnap_table_removed_key(lua_State *L, int tidx, uint32_t node, int kidx, int dead);
/* Whether the key at kidx is of a kind a code-1 node's key can be (not dead: a long string,
** an object or a light C function; dead: any). Reads only. */
int luasnap_removed_key_kind(lua_State *L, int kidx, int dead);
/* Where a table's layout did not apply: puts the key at kidx into the table at tidx as an
** entry being removed (a placeholder value until luasnap_table_seal_removed), so `next` finds
** it (in the lowest free node where Lua's insertion picks a free node for it, so a loop
** suspended at it visits the most entries after it); dead: it becomes a dead key then. 0 inserted; 1 skipped (the table holds the key in a
** node already, the key takes no node, or the table has no room without growing). The
** caller reserves two stack slots. */
int luasnap_table_add_removed(lua_State *L, int tidx, int kidx, int dead);
/* Empties the entries luasnap_table_add_removed gave the table at tidx; returns how many. */
uint32_t luasnap_table_seal_removed(lua_State *L, int tidx);
/* Resizes the hash part of the table at idx to `nodes` nodes (a power of two), its entries
** reinserted; raises a memory error. */
LUASNAP_RAISES void luasnap_table_resize_nodes(lua_State *L, int idx, uint32_t nodes);
/* Scratch bytes a relayout of `size` nodes needs. */
size_t luasnap_relayout_scratch(uint32_t size);
/* Bytes of a relayout memo (zeroed: empty); its collision-chain limit (0: none); whether the
** load passed that limit. */
size_t luasnap_relayout_memo_size(void);
void luasnap_relayout_memo_limit(void *memo, uint64_t limit);
int luasnap_relayout_memo_over(const void *memo);
/* lua_rawset(L, idx) with the key's collision chain charged to the memo's limit first: -1
** (nothing set) once the limit is passed, else 0. */
LUASNAP_RAISES int luasnap_rawset_charged(lua_State *L, int idx, void *memo);
/* The VM's hash seed. */
uint32_t luasnap_hash_seed(lua_State *L);

/* ===================== ident.c: identities of keys (patch 4), for save-games ===================== */

/* The identity of the object at idx (a table, closure, full userdata or thread), 0 for any
** other value or an object never a key. */
uint32_t luasnap_identity_at(lua_State *L, int idx);
/* The identity of the table, closure or thread o (the object lua_topointer gives for these). */
uint32_t luasnap_identity(const void *o);
/* Gives the object at idx the identity id if it has none (a new object); returns whether it
** did (0 also for any other value, or id 0). */
int luasnap_set_identity(lua_State *L, int idx, uint32_t id);
/* Gives the object at idx, if it has no identity yet, the identity of `name` (bit 31 set). */
void luasnap_name_identity(lua_State *L, int idx, const char *name, size_t len);
/* How many identities the VM's counter gave (the last one follows: ltable.c, luaH_keyid),
** and setting it (a whole-game load). */
uint64_t luasnap_key_counter(lua_State *L);
void luasnap_set_key_counter(lua_State *L, uint64_t n);

/* ===================== state.c: the collector and memory, for the serializer ===================== */

/* Stops (on > 0) or allows (0) emergency collections, or only asks (< 0); returns whether they
** were stopped. */
int luasnap_gc_stopem(lua_State *L, int on);
/* Makes (on > 0) the state's collections quiet (Lua patch 10) or stock (0), or only asks (< 0);
** returns whether they were quiet. */
int luasnap_gc_quiet(lua_State *L, int on);
size_t luasnap_gc_uncounted(lua_State *L);
/* Makes (on > 0) a removed key (not a number or boolean) set again take a new node (Lua patch 11) or reuse
** its old one as stock Lua may (0), or only asks (< 0); returns whether it was on. */
int luasnap_fresh_keys(lua_State *L, int on);
/* Makes (on != 0) collectgarbage() an error while the host reads the state, or allows it
** (0); returns whether it was an error. */
int luasnap_gc_nopoints(lua_State *L, int on);
/* The positions (next search, end of the last match or -1) of the string.gmatch iterator at
** idx as offsets into its subject, for the value digest; 0 if its upvalues are not gmatch's. */
int luasnap_gmatch_positions(lua_State *L, int idx, int64_t *out);
/* Defers the collector's steps while the host reads the state (returns the debt to give back)
** and gives the debt back, less what the read allocated. */
int64_t luasnap_gc_defer_begin(lua_State *L);
void luasnap_gc_defer_end(lua_State *L, int64_t saved);
/* A full collection that is not a point (quiet if the state is); protected body only. */
LUASNAP_RAISES void luasnap_gc_full_quiet(lua_State *L);
/* Marks (on != 0) or unmarks the state as one where nothing gets a finalizer; returns whether
** it was marked. */
int luasnap_gc_nofinal(lua_State *L, int on);
/* Whether an object made since the load's first table (at stack index since) has a __gc that
** is not one of the game's Lua functions: 0 none, 1 a C function, 2 another value, 3 a Lua
** function compiled from a save-game's text. */
int luasnap_finalizers_foreign(lua_State *L, int since);
/* Marks for finalization the objects made since the one at stack index since (one walk), with
** the state's no-finalizer bit cleared meanwhile if clear. */
void luasnap_finalizers_mark(lua_State *L, int since, int clear);
/* The finalization states luasnap_final_state reports (save-game format 8). */
#define LS_FINAL_NONE 0
#define LS_FINAL_UNMARKED 1
#define LS_FINAL_MARKED 2
/* For the writer: the finalization state of the table or full userdata o; the objects marked
** for finalization, in the order Lua would finalize them (the first cap in out[]; returns how
** many). Read only. */
int luasnap_final_state(lua_State *L, const void *o);
int luasnap_final_state_at(lua_State *L, int idx, const void **gco);
size_t luasnap_finalizer_list(lua_State *L, const void **out, size_t cap);
/* For the writer: pushes the table or full userdata o that luasnap_finalizer_list gave (with
** the collector stopped and no Lua code run since); 0, pushing nothing, for another kind. */
int luasnap_push_finalizable(lua_State *L, const void *o);
/* For the loader: sets the metatable on top (popped) without marking the object at idx for
** finalization (0: not a table or userdata, or not a metatable); restores the marks a file
** of format 8 records when the load ends (0: a mark the load cannot give; nothing marked). */
int luasnap_setmetatable_unmarked(lua_State *L, int idx);
int luasnap_finalizers_restore(lua_State *L, int since, int objs, const uint32_t *marked,
                               int n, const uint32_t *unmarked, int m, int clear,
                               void **scratch);
/* For a whole-game load: the head of the list of objects marked for finalization when it
** begins; when it has replaced the state, drops the replaced state's pending finalizers and
** unmarks its unreachable marked objects at the next full collection (Lua patch 14). */
const void *luasnap_finalizers_head(lua_State *L);
void luasnap_finalizers_replaced(lua_State *L, const void *head);
/* luaL_checkstack, raising a memory error (not "stack overflow") when growing failed for want
** of memory. */
LUASNAP_RAISES void luasnap_checkstack(lua_State *L, int n, const char *msg);
/* Raises Lua's memory error. */
LUASNAP_RAISES _Noreturn void luasnap_raise_memerr(lua_State *L);
/* Bytes the VM has allocated. */
uint64_t luasnap_heap_bytes(lua_State *L);

/* ===================== canonical.c: arena bytes that depend on the Lua state alone ===================== */

/* Zeroes the dead stack slots of th (not running) that are not zero already and resets a
** coroutine's C-call count; returns how many slots it wrote. */
int luasnap_settle_thread(lua_State *th);
/* After a host call: the main thread's dead slots and free CallInfo records zeroed. */
void luasnap_scrub_idle_state(lua_State *L);
/* Sets every stack slot above the top to nil. */
void luasnap_clear_dead_stack(lua_State *L);
/* Refills the API string cache with the string Lua starts it with. */
void luasnap_reset_strcache(lua_State *L);
/* Whether the value at idx (> 0) is an object a weak table can lose (not a string). */
int luasnap_is_weak_removable(lua_State *L, int idx);
/* The smallest block that can be a stack. */
extern const size_t luasnap_min_stack_bytes;
/* Whether any stack-value-sized slot of the block is tagged as a light userdata. */
int luasnap_has_light(const void *p, size_t size);
/* Zeroes every slot of the dead block tagged as a light userdata. */
void luasnap_scrub_light(void *p, size_t size);

/* ===================== budget.c: the instruction budget of a call (lvm.h) ===================== */

/* Starts a budget of `budget` instructions (as lvm.h counts them) for the Lua code this OS
** thread runs, coroutines and finalizers included, until luasnap_budget_end; once spent, Lua
** code raises an error at each call and backward jump, whose message is `spent_message` (a
** string that lives as long as the program: what stopped the code, what to do). 0 (and
** nothing changes) if a budget is running already. */
int luasnap_budget_begin(uint64_t budget, const char *spent_message);
/* Ends the budget luasnap_budget_begin(budget) started: *used = the instructions charged (at
** most `budget`); returns 1 if it was spent, with where = "chunk:line" of the first stop
** (n bytes, NUL-terminated), else 0 and where = "". */
int luasnap_budget_end(uint64_t budget, uint64_t *used, char *where, size_t n);
/* The save-game load's instruction-budget hook (a count hook), which finalizers keep. */
void luasnap_register_load_hook(lua_Hook h);
/* (lgc.c's GCTM asks ls_finalizer_keeps_hook, declared in lgc.h, whether a finalizer runs
** with hooks allowed, so that the budget stops it: Lua patch 8.) */

/* ===================== strkey.c: the string table's keyed hash (Lua patch 9) ===================== */

/* (lstring.c calls ls_strkey_init and ls_strkey_hash, declared in strkey.h.) */
/* The length of the longest chain in the string table (for tests). */
int luasnap_strtab_longest_chain(lua_State *L);

/* ===================== corolib.c: the coroutine library ===================== */

/* coroutine.resume, coroutine.wrap, coroutine.close (lcorolib.c's, settling each coroutine). */
LUASNAP_RAISES int luasnap_co_resume(lua_State *L);
LUASNAP_RAISES int luasnap_co_wrap(lua_State *L);
LUASNAP_RAISES int luasnap_co_close(lua_State *L);

/* ===================== detsort.c: the deterministic profile's library functions ===================== */

/* table.sort with a deterministic pivot. */
LUASNAP_RAISES int luasnap_det_sort(lua_State *L);
/* math.randomseed that refuses to seed from the clock. */
LUASNAP_RAISES int luasnap_det_randomseed(lua_State *L);

/* ===================== cfids.c: light C functions' identities as keys (in the Lua library) ===================== */

/* Makes name the identity of the light C function f as a table key, in every VM of the
** process, unless it has one: 1 entered, 0 named before, -1 the map is full. */
int luasnap_cfunction_name(lua_CFunction f, const char *name, size_t len);

/* ===================== readline.c: the stand-alone interpreter's terminal ===================== */

/* Loads the readline library `lib`; 0 (and a warning through L) if it cannot. */
int luasnap_readline_init(lua_State *L, const char *lib);
/* 1 and *line = a malloc'd line (NULL at end of input) if readline is loaded; else 0. */
int luasnap_readline(const char *prompt, char **line);
/* Adds a nonempty line to the history and frees it. */
void luasnap_readline_done(char *line);
/* SIGPIPE's default action (a closed output ends the program quietly). */
void luasnap_default_sigpipe(void);
/* Around a step: on = 1 lets Ctrl-C interrupt L, 0 restores the default. */
void luasnap_interruptible(lua_State *L, int on);

#endif
