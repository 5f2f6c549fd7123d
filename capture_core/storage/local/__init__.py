"""The local byte store: `LocalStore` on a POSIX disk, in modules by concern.

`store` holds `LocalStore`, the `ByteStore` on a local (or locally mounted) filesystem.
`durability` makes its writes survive a crash (file and folder fsyncs, the latter shared by
concurrent writers of a folder); `folder_index` remembers the folders this process made
sure exist; `reading` lists folders and names a failed access; `pinned` is the view of one
folder held by its descriptor that the sweep and the clear use; `temporaries` owns
`<root>/.tmp/`, where writers stage their data and the sweep removes what they left.
Other modules import `LocalStore`, `TMP_DIR` and `fsync_dir` from here.
"""

from capture_core.storage.local.durability import fsync_dir
from capture_core.storage.local.store import LocalStore
from capture_core.storage.local.temporaries import TMP_DIR

__all__ = ["TMP_DIR", "LocalStore", "fsync_dir"]
