/* IPC of pooled blocks (cs_ipc.c): the export half, which cuIpcGetMemHandle (cs_pointer.c)
 * calls for a pooled block in use; the import half is the cuIpcOpenMemHandle and
 * cuIpcCloseMemHandle wrappers. */
#ifndef CS_IPC_H
#define CS_IPC_H

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "cs_cache.h"

/* A handle of the block that another process under the shim can open; the block's own
 * exporting process serves its memory from then on. exportable: the block's heap makes its
 * chunks exportable (cs_backend_exportable). */
CUresult cs_ipc_export(CUipcMemHandle *handle, const cs_block_info *block, bool exportable);

/* Is ptr in memory this process opened from another's handle (what its range covers, the
 * chunks under the block)? Then the block's start and size there, and the context that
 * opened it. */
bool cs_ipc_find_import(uint64_t ptr, uint64_t *base, uint64_t *size, CUcontext *ctx);

/* A forked child has none of the parent's imports, and no server yet. */
void cs_ipc_after_fork_child(void);

#endif
