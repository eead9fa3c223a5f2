/*
** strkey.h: the string table's keyed hash (Lua patch 9), as lstring.c calls it (strkey.c
** holds it).
*/
#ifndef LUASNAP_STRKEY_H
#define LUASNAP_STRKEY_H

#include <stddef.h>

/* Draws the process's key, once (luaS_init calls it; later calls do nothing). */
void ls_strkey_init(void);
/* SipHash-1-3 of str[0..l) under the process's key, folded to 32 bits: the chain of the string
** table a short string sits in. */
unsigned int ls_strkey_hash(const char *str, size_t l);

#endif
