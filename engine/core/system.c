/* The allocator and the disk.
 *
 * keep_freed_memory(most) -> bool
 *     Have the C allocator (glibc's) serve blocks of up to `most` bytes from its heap and keep
 *     up to twice that freed at the heap's top, rather than map each big block anew and
 *     unmap it when freed: every rendered batch is such a block, and each fresh mapping
 *     faults in zeroed pages again (a text batch of 100-byte records rendered four times
 *     slower). A process setting (the CLI's); False where the allocator has no such setting.
 *
 * allocates_ahead(fd) -> bool
 * allocate_ahead(fd, offset, length) -> int
 *     Disk blocks for a large write, allocated before it: fallocate(FALLOC_FL_KEEP_SIZE) of
 *     [offset, offset + length), the file's size unchanged. Where the file system delays
 *     allocation (ext4), a buffered write into blocks allocated already skips reserving each
 *     page as it copies: a 1 MiB append is a third faster, but a 4 KiB one twice as slow
 *     (the call's own cost). allocates_ahead says whether `fd`'s file system is of the kind
 *     where that holds (ext4's magic number, which ext2 and ext3 share: there allocate_ahead
 *     fails with EOPNOTSUPP). allocate_ahead returns 0, or the errno (advice: the write goes
 *     ahead either way and meets the same ENOSPC or EIO itself). The GIL is released during
 *     the call.
 */

#include "core.h"

PyObject *keep_freed_memory(PyObject *self, PyObject *args) {
    Py_ssize_t most;
    if (!PyArg_ParseTuple(args, "n", &most)) return NULL;
    if (most < 0) {
        PyErr_SetString(PyExc_ValueError, "keep_freed_memory: a size is not negative");
        return NULL;
    }
#ifdef __GLIBC__
    /* (glibc caps the mapping threshold at 32 MiB on 64-bit machines and refuses more) */
    int threshold = (int)(most < KEEP_MOST ? most : KEEP_MOST);
    return PyBool_FromLong(mallopt(M_MMAP_THRESHOLD, threshold) && mallopt(M_TRIM_THRESHOLD, 2 * threshold));
#else
    Py_RETURN_FALSE;
#endif
}

PyObject *allocates_ahead(PyObject *self, PyObject *args) {
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd)) return NULL;
#ifdef __linux__
    struct statfs about;
    int known;
    Py_BEGIN_ALLOW_THREADS
    known = fstatfs(fd, &about) == 0;
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(known && about.f_type == EXT4_SUPER_MAGIC);
#else
    Py_RETURN_FALSE;
#endif
}

PyObject *allocate_ahead(PyObject *self, PyObject *args) {
    int fd;
    long long offset, length;
    if (!PyArg_ParseTuple(args, "iLL", &fd, &offset, &length)) return NULL;
    if (offset < 0 || length <= 0) {
        PyErr_SetString(PyExc_ValueError, "allocate_ahead: the offset must not be negative, the length must be positive");
        return NULL;
    }
#ifdef __linux__
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = fallocate(fd, FALLOC_FL_KEEP_SIZE, (off_t)offset, (off_t)length) == 0 ? 0 : errno;
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(error);
#else
    return PyLong_FromLong(EOPNOTSUPP);
#endif
}
