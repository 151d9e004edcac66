;; The wasm twin of probe.py: one module, one exported function per behaviour, each
;; an entry point a test Tool names (wasm.entrypoint). Compiled at test time with
;; wasmtime.wat2wasm. The exec contract: the arguments (JSON) on stdin, the result on
;; stdout, failures on stderr with a non-zero exit.
;;
;; Memory: 0-32 scratch (iovec, counts, fds), 1024-2047 constant strings,
;; IN (65536) the arguments (at most 256 KiB), ENVP (327680) environment pointers,
;; ENVB (335872) environment strings, FILL (458752) one page of "x".
(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $environ_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $environ_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 8)

  (data (i32.const 1024) "{\"arguments\":")   ;; 13
  (data (i32.const 1040) ",\"env\":[")        ;; 8
  (data (i32.const 1050) "\"")                ;; 1
  (data (i32.const 1052) ",")                 ;; 1
  (data (i32.const 1054) "]}")                ;; 2
  (data (i32.const 1060) "something went wrong: ")  ;; 22
  (data (i32.const 1090) "data.txt")          ;; 8
  (data (i32.const 1100) "out.txt")           ;; 7
  (data (i32.const 1110) "\ff\fe\00\01 not json \c3")  ;; 15
  (data (i32.const 1140) "written")           ;; 7

  (global $IN i32 (i32.const 65536))
  (global $IN_CAP i32 (i32.const 262144))
  (global $ENVP i32 (i32.const 327680))
  (global $ENVB i32 (i32.const 335872))
  (global $FILL i32 (i32.const 458752))

  ;; write len bytes at ptr to fd (one fd_write; the host takes them all)
  (func $write (param $fd i32) (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 16))))

  ;; read fd to its end into IN; the number of bytes read
  (func $read_all (param $fd i32) (result i32)
    (local $n i32)
    (block $done
      (loop $more
        (i32.store (i32.const 0) (i32.add (global.get $IN) (local.get $n)))
        (i32.store (i32.const 4) (i32.sub (global.get $IN_CAP) (local.get $n)))
        (br_if $done (call $fd_read (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 16)))
        (br_if $done (i32.eqz (i32.load (i32.const 16))))
        (local.set $n (i32.add (local.get $n) (i32.load (i32.const 16))))
        (br $more)))
    (local.get $n))

  (func $strlen (param $ptr i32) (result i32)
    (local $n i32)
    (block $end
      (loop $next
        (br_if $end (i32.eqz (i32.load8_u (i32.add (local.get $ptr) (local.get $n)))))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br $next)))
    (local.get $n))

  ;; the offset in IN of the k-th (0-based) '"' within n bytes, or n
  (func $quote (param $n i32) (param $k i32) (result i32)
    (local $i i32)
    (block $end
      (loop $next
        (br_if $end (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.eq (i32.load8_u (i32.add (global.get $IN) (local.get $i))) (i32.const 34))
          (then
            (br_if $end (i32.eqz (local.get $k)))
            (local.set $k (i32.sub (local.get $k) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (local.get $i))

  ;; {"arguments": <stdin>, "env": ["K=V", ...]}
  (func (export "echo")
    (local $n i32) (local $count i32) (local $i i32) (local $ptr i32)
    (local.set $n (call $read_all (i32.const 0)))
    (call $write (i32.const 1) (i32.const 1024) (i32.const 13))
    (call $write (i32.const 1) (global.get $IN) (local.get $n))
    (call $write (i32.const 1) (i32.const 1040) (i32.const 8))
    (drop (call $environ_sizes_get (i32.const 20) (i32.const 24)))
    (local.set $count (i32.load (i32.const 20)))
    (drop (call $environ_get (global.get $ENVP) (global.get $ENVB)))
    (block $end
      (loop $next
        (br_if $end (i32.ge_u (local.get $i) (local.get $count)))
        (if (local.get $i) (then (call $write (i32.const 1) (i32.const 1052) (i32.const 1))))
        (local.set $ptr (i32.load (i32.add (global.get $ENVP) (i32.mul (local.get $i) (i32.const 4)))))
        (call $write (i32.const 1) (i32.const 1050) (i32.const 1))
        (call $write (i32.const 1) (local.get $ptr) (call $strlen (local.get $ptr)))
        (call $write (i32.const 1) (i32.const 1050) (i32.const 1))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (call $write (i32.const 1) (i32.const 1054) (i32.const 2)))

  ;; loops until stopped (fuel, epoch)
  (func (export "spin")
    (loop $forever (br $forever)))

  ;; {"size": N}: N bytes of "x" on stdout (the first number of the arguments)
  (func (export "flood")
    (local $n i32) (local $i i32) (local $c i32) (local $size i32) (local $chunk i32)
    (local.set $n (call $read_all (i32.const 0)))
    (block $end
      (loop $next
        (br_if $end (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.load8_u (i32.add (global.get $IN) (local.get $i))))
        (if (i32.and (i32.ge_u (local.get $c) (i32.const 48)) (i32.le_u (local.get $c) (i32.const 57)))
          (then (local.set $size
            (i32.add (i32.mul (local.get $size) (i32.const 10)) (i32.sub (local.get $c) (i32.const 48)))))
          (else (br_if $end (i32.ne (local.get $size) (i32.const 0)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (memory.fill (global.get $FILL) (i32.const 120) (i32.const 65536))
    (block $done
      (loop $write_more
        (br_if $done (i32.eqz (local.get $size)))
        (local.set $chunk
          (select (i32.const 65536) (local.get $size) (i32.gt_u (local.get $size) (i32.const 65536))))
        (call $write (i32.const 1) (global.get $FILL) (local.get $chunk))
        (local.set $size (i32.sub (local.get $size) (local.get $chunk)))
        (br $write_more))))

  ;; {"reason": "..."}: "something went wrong: <reason>" on stderr, exit 3
  (func (export "fail")
    (local $n i32) (local $from i32) (local $to i32)
    (local.set $n (call $read_all (i32.const 0)))
    (local.set $from (i32.add (call $quote (local.get $n) (i32.const 2)) (i32.const 1)))
    (local.set $to (call $quote (local.get $n) (i32.const 3)))
    (call $write (i32.const 2) (i32.const 1060) (i32.const 22))
    (call $write (i32.const 2) (i32.add (global.get $IN) (local.get $from))
      (i32.sub (local.get $to) (local.get $from)))
    (call $proc_exit (i32.const 3)))

  ;; grows its memory a page at a time until refused, then traps (a runaway allocator)
  (func (export "grow")
    (loop $more
      (br_if $more (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))
    unreachable)

  ;; data.txt of the first preopened directory (fd 3) on stdout; exit with the errno
  (func (export "read")
    (local $errno i32)
    (local.set $errno (call $path_open (i32.const 3) (i32.const 0) (i32.const 1090) (i32.const 8)
      (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 28)))
    (if (local.get $errno) (then (call $proc_exit (local.get $errno))))
    (call $write (i32.const 1) (global.get $IN) (call $read_all (i32.load (i32.const 28)))))

  ;; creates out.txt in the first preopened directory (fd 3); exit with the errno
  (func (export "write")
    (local $errno i32)
    (local.set $errno (call $path_open (i32.const 3) (i32.const 0) (i32.const 1100) (i32.const 7)
      (i32.const 9) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 28)))
    (if (local.get $errno) (then (call $proc_exit (local.get $errno))))
    (call $write (i32.load (i32.const 28)) (i32.const 1140) (i32.const 7))
    (call $write (i32.const 1) (i32.const 1140) (i32.const 7)))

  ;; bytes that are neither JSON nor UTF-8
  (func (export "garbage")
    (call $write (i32.const 1) (i32.const 1110) (i32.const 15)))

  ;; divides by zero: a trap that is no limit
  (func (export "divide")
    (drop (i32.div_u (i32.const 1) (i32.sub (i32.const 1) (i32.const 1)))))
)
