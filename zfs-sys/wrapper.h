/* The headers zfs-sys binds: libzfs_core, the part of libzfs the safe API uses,
 * libnvpair, and zfs_prop.h for the property tables libzfs exports. */
#include <libzfs_core.h>
#include <libzfs.h>
#include <libnvpair.h>
#include <zfs_prop.h>
