/* IPC of pooled blocks (cs_ipc.c): the export half, which cuIpcGetMemHandle (cs_pointer.c)
 * calls for a pooled block in use; the import half is the cuIpcOpenMemHandle and
 * cuIpcCloseMemHandle wrappers. */
#ifndef CS_IPC_H
#define CS_IPC_H

#include <cuda.h>

#include "cs_cache.h"

/* A handle of the block that another process under the shim can open; the block's own
 * exporting process serves its memory from then on. */
CUresult cs_ipc_export(CUipcMemHandle *handle, const cs_block_info *block);

#endif
