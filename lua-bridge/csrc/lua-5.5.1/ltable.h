/*
** $Id: ltable.h $
** Lua tables (hash)
** See Copyright Notice in lua.h
*/

#ifndef ltable_h
#define ltable_h

#include "lobject.h"


#define gnode(t,i)	(&(t)->node[i])
#define gval(n)		(&(n)->i_val)
#define gnext(n)	((n)->u.next)


/*
** Clear all bits of fast-access metamethods, which means that the table
** may have any of these metamethods. (First access that fails after the
** clearing will set the bit again.)
*/
/* luasnap patch (see LUASNAP-PATCHES.md): clears them only if one is set, so a table whose
** cache is already clear is not written (every assignment to an absent key calls this). */
#define invalidateTMcache(t)	((void)(((t)->flags & maskflags) && \
                                 ((t)->flags &= cast_byte(~maskflags))))


/*
** Bit BITDUMMY set in 'flags' means the table is using the dummy node
** for its hash part.
*/

#define BITDUMMY		(1 << 6)
#define NOTBITDUMMY		cast_byte(~BITDUMMY)
#define isdummy(t)		((t)->flags & BITDUMMY)

/*
** luasnap patch (see LUASNAP-PATCHES.md): bit 7 set in 'flags' means the
** table's object keys hash by address and get no identity (see 'gcoid'
** in lobject.h): the anchor table of the compiler and of the binary
** loader, which keeps a chunk's main closure and each function's
** constant cache alive by using them as keys. Compiling then takes no
** identities, so a host that compiles code at another time than another
** process (a check after a load) does not shift the identities of the
** game's keys; and a loaded chunk's function gets one only if the game
** makes it a key. That table is internal and never traversed.
*/
#define BITNOIDS		(1 << 7)
#define noids(t)		((t)->flags & BITNOIDS)

#define setnodummy(t)		((t)->flags &= NOTBITDUMMY)
#define setdummy(t)		((t)->flags |= BITDUMMY)



/* allocated size for hash nodes */
#define allocsizenode(t)	(isdummy(t) ? 0 : sizenode(t))


/* returns the Node, given the value of a table entry */
#define nodefromval(v)	cast(Node *, (v))



#define luaH_fastgeti(t,k,res,tag) \
  { Table *h = t; lua_Unsigned u = l_castS2U(k) - 1u; \
    if ((u < luaH_asize(h))) { \
      tag = *getArrTag(h, u); \
      if (!tagisempty(tag)) { farr2val(h, u, tag, res); }} \
    else { tag = luaH_getint(h, (k), res); }}


#define luaH_fastseti(t,k,val,hres) \
  { Table *h = t; lua_Unsigned u = l_castS2U(k) - 1u; \
    if ((u < luaH_asize(h))) { \
      lu_byte *tag = getArrTag(h, u); \
      if (checknoTM(h->metatable, TM_NEWINDEX) || !tagisempty(*tag)) \
        { fval2arr(h, u, tag, val); hres = HOK; } \
      else hres = ~cast_int(u); } \
    else { hres = luaH_psetint(h, k, val); }}


/* results from pset */
#define HOK		0
#define HNOTFOUND	1
#define HNOTATABLE	2
#define HFIRSTNODE	3

/*
** 'luaH_get*' operations set 'res', unless the value is absent, and
** return the tag of the result.
** The 'luaH_pset*' (pre-set) operations set the given value and return
** HOK, unless the original value is absent. In that case, if the key
** is really absent, they return HNOTFOUND. Otherwise, if there is a
** slot with that key but with no value, 'luaH_pset*' return an encoding
** of where the key is (usually called 'hres'). (pset cannot set that
** value because there might be a metamethod.) If the slot is in the
** hash part, the encoding is (HFIRSTNODE + hash index); if the slot is
** in the array part, the encoding is (~array index), a negative value.
** The value HNOTATABLE is used by the fast macros to signal that the
** value being indexed is not a table.
** (The size for the array part is limited by the maximum power of two
** that fits in an unsigned integer; that is INT_MAX+1. So, the C-index
** ranges from 0, which encodes to -1, to INT_MAX, which encodes to
** INT_MIN. The size of the hash part is limited by the maximum power of
** two that fits in a signed integer; that is (INT_MAX+1)/2. So, it is
** safe to add HFIRSTNODE to any index there.)
*/


/*
** The array part of a table is represented by an inverted array of
** values followed by an array of tags, to avoid wasting space with
** padding. In between them there is an unsigned int, explained later.
** The 'array' pointer points between the two arrays, so that values are
** indexed with negative indices and tags with non-negative indices.

             Values                              Tags
  --------------------------------------------------------
  ...  |   Value 1     |   Value 0     |unsigned|0|1|...
  --------------------------------------------------------
                                       ^ t->array

** All accesses to 't->array' should be through the macros 'getArrTag'
** and 'getArrVal'.
**
** luasnap patch (see LUASNAP-PATCHES.md): two unsigned ints sit between
** the arrays: the number of slots ('luaH_asize', which stock Lua keeps
** in 'Table.asize'), then the hint. Its place in 'Table' holds the
** table's identity as a key, so a table stays 48 bytes. A table with no
** array part points 'array' at a shared block whose size is 0 (never
** written: 'lenhint' is written only when the size is not 0), so
** reading the size needs no test.

             Values                                     Tags
  ----------------------------------------------------------------
  ...  |   Value 1     |   Value 0     |size|hint|0|1|...
  ----------------------------------------------------------------
                                       ^ t->array
*/

/* luasnap patch: the number of slots of the array part */
#define luaH_asize(t)	(cast(const unsigned *, (t)->array)[0])

/* luasnap patch: sets it (a real array block: the size is not 0) */
#define luaH_setasize(t,n)	(cast(unsigned *, (t)->array)[0] = (n))

/* luasnap patch: bytes of an array block with 'n' slots (not 0) */
#define luaH_arraybytes(n)	\
	(cast_sizet(n) * (sizeof(Value) + 1) + 2 * sizeof(unsigned))

/* Computes the address of the tag for the abstract C-index 'k' */
#define getArrTag(t,k)	(cast(lu_byte*, (t)->array) + 2 * sizeof(unsigned) + (k))

/* Computes the address of the value for the abstract C-index 'k' */
#define getArrVal(t,k)	((t)->array - 1 - (k))


/*
** The unsigned between the two arrays is used as a hint for #t;
** see luaH_getn. It is stored there to avoid wasting space in
** the structure Table for tables with no array part.
*/
#define lenhint(t)	(cast(unsigned*, (t)->array) + 1)  /* luasnap patch: after the size */


/*
** Move TValues to/from arrays, using C indices
*/
#define arr2obj(h,k,val)  \
  ((val)->tt_ = *getArrTag(h,(k)), (val)->value_ = *getArrVal(h,(k)))

#define obj2arr(h,k,val)  \
  (*getArrTag(h,(k)) = (val)->tt_, *getArrVal(h,(k)) = (val)->value_)


/*
** Often, we need to check the tag of a value before moving it. The
** following macros also move TValues to/from arrays, but receive the
** precomputed tag value or address as an extra argument.
*/
#define farr2val(h,k,tag,res)  \
  ((res)->tt_ = tag, (res)->value_ = *getArrVal(h,(k)))

/* luasnap patch 13: stores only when the slot's bytes change (lobject.h) */
#define fval2arr(h,k,tag,val)  \
  { Value *v_ = getArrVal(h,(k)); \
    if (!luasnap_samevalue(*v_, *(tag), (val)->value_, (val)->tt_)) \
      { *(tag) = (val)->tt_; *v_ = (val)->value_; } }


LUAI_FUNC lu_byte luaH_get (Table *t, const TValue *key, TValue *res);
LUAI_FUNC lu_byte luaH_getshortstr (Table *t, TString *key, TValue *res);
LUAI_FUNC lu_byte luaH_getstr (Table *t, TString *key, TValue *res);
LUAI_FUNC lu_byte luaH_getint (Table *t, lua_Integer key, TValue *res);

/* Special get for metamethods */
LUAI_FUNC const TValue *luaH_Hgetshortstr (Table *t, TString *key);

LUAI_FUNC int luaH_psetint (Table *t, lua_Integer key, TValue *val);
LUAI_FUNC int luaH_psetshortstr (Table *t, TString *key, TValue *val);
LUAI_FUNC int luaH_psetstr (Table *t, TString *key, TValue *val);
LUAI_FUNC int luaH_pset (Table *t, const TValue *key, TValue *val);

LUAI_FUNC void luaH_setint (lua_State *L, Table *t, lua_Integer key,
                                                    TValue *value);
LUAI_FUNC void luaH_set (lua_State *L, Table *t, const TValue *key,
                                                 TValue *value);

LUAI_FUNC void luaH_finishset (lua_State *L, Table *t, const TValue *key,
                                              TValue *value, int hres);
LUAI_FUNC Table *luaH_new (lua_State *L);
LUAI_FUNC void luaH_resize (lua_State *L, Table *t, unsigned nasize,
                                                    unsigned nhsize);
LUAI_FUNC void luaH_resizearray (lua_State *L, Table *t, unsigned nasize);
LUAI_FUNC lu_mem luaH_size (Table *t);
LUAI_FUNC void luaH_free (lua_State *L, Table *t);
LUAI_FUNC int luaH_next (lua_State *L, Table *t, StkId key);
LUAI_FUNC lua_Unsigned luaH_getn (lua_State *L, Table *t);


/* luasnap patch (see LUASNAP-PATCHES.md): identities of keys (see 'gcoid' in lobject.h). */
LUAI_FUNC void luaH_keyid (lua_State *L, GCObject *o);
LUAI_FUNC unsigned int luasnap_cfunction_id (lua_CFunction f);
LUAI_FUNC int luasnap_cfunction_name (lua_CFunction f, const char *name, size_t len);
LUAI_FUNC int luasnap_cfunction_named (lua_CFunction f);
LUAI_FUNC unsigned int luasnap_name_hash (const char *name, size_t len);

/* luasnap patch (see LUASNAP-PATCHES.md): declared and compiled in every build. */
LUAI_FUNC Node *luaH_mainposition (const Table *t, const TValue *key);


#endif
