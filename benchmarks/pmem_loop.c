/*
 * pmem_loop.c -- the hand-written baseline: a loop of pmem_memcpy_persist into a
 * mapped, pre-faulted file, one record at a time, no header, no CRC.
 *
 * usage: pmem_loop FILE RECORD_SIZE SECONDS   (prints records/s)
 * Built by benchmarks/common.py with `cc -O2 pmem_loop.c -ldl`; libpmem is
 * dlopen()ed like pmemwal does, so PMEM_IS_PMEM_FORCE applies the same way.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return fprintf(stderr, "usage: %s FILE RECORD_SIZE SECONDS\n", argv[0]), 2;
    size_t size = strtoul(argv[2], NULL, 0), span = 64u << 20;
    double seconds = atof(argv[3]);
    void *lib = dlopen("libpmem.so.1", RTLD_NOW);
    if (!lib)
        return fprintf(stderr, "libpmem: %s\n", dlerror()), 3;
    void *(*memcpy_persist)(void *, const void *, size_t) = dlsym(lib, "pmem_memcpy_persist");
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || posix_fallocate(fd, 0, span))
        return perror("file"), 1;
    char *map = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    char *src = malloc(size);
    memset(src, 0x5a, size);
    unsigned long n = 0;
    size_t off = 0;
    double start = now(), end = start + seconds;
    while (now() < end) {
        for (int i = 0; i < 64; i++, n++) {
            if (off + size > span)
                off = 0; /* wrap: the pages stay resident, as in a recycled WAL */
            memcpy_persist(map + off, src, size);
            off += size;
        }
    }
    printf("%.1f\n", n / (now() - start));
    munmap(map, span);
    close(fd);
    unlink(argv[1]);
    return 0;
}
