//! Process-wide settings a binary may choose; the library never sets them itself.

/// Tells glibc's malloc, once per process, to keep up to 1 GB of freed memory instead of
/// returning it to the system, and to serve blocks up to 32 MB from its heap.
///
/// libtorch allocates every activation with malloc. With glibc's defaults the heap top is
/// trimmed after a forward pass frees its activations, and the next pass page-faults the same
/// memory back in. Measured on the demo model, batch 8 × 48 tokens, 2 threads: 31% of prefill
/// time was the kernel's (page faults, `brk`), and prefill ran at 38-47k tokens/s, against
/// 74-77k with these settings (docs/PERFORMANCE.md). Peak memory is unchanged; memory held
/// after a generation can be up to 1 GB more. A no-op on other C libraries, and when the
/// environment sets `HEADCOUNT_KEEP_FREED_MEMORY=0`.
pub fn keep_freed_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("HEADCOUNT_KEEP_FREED_MEMORY").is_some_and(|v| v == "0") {
            return;
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only sets malloc's tunables; any value is accepted or refused (0).
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
            libc::mallopt(libc::M_TOP_PAD, 64 << 20);
        }
    });
}

/// Keeps the panic hook from printing the panics of the `tokenizers` library that
/// [`crate::text::TextCodec`] turns into errors (a malformed tokenizer.json); every other
/// panic, on any thread, still reaches the hook that was there before. Installed once.
pub fn quiet_tokenizer_panics() {
    crate::text::install_quiet_hook();
}
