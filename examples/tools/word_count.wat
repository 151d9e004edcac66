;; The word-count tool as a WebAssembly module (WAT source of word_count.wasm).
;;
;; The exec contract over WASI: the arguments {"text": "..."} as JSON on stdin, the
;; result {"words": N} on stdout. Words are runs of characters between ASCII
;; whitespace (a space, or the JSON escapes \n, \t, \r). It imports nothing but
;; fd_read and fd_write, so it runs with no WASI grant at all.
;;
;; Built with wasmtime's own WAT compiler (tests check the .wasm matches this file):
;;   python -c "import wasmtime, pathlib; pathlib.Path('examples/tools/word_count.wasm')
;;     .write_bytes(wasmtime.wat2wasm(pathlib.Path('examples/tools/word_count.wat').read_text()))"
(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 1024) "{\"words\":")   ;; 9 bytes
  (data (i32.const 1040) "}\n")            ;; 2 bytes
  ;; 0-16: iovec and counts; 1024-1100: strings; 1100-1120: digits; 2048-: the input

  (func $write (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))

  ;; stdin into 2048.. (at most 126 KiB); its length
  (func $read (result i32)
    (local $n i32)
    (block $done
      (loop $more
        (i32.store (i32.const 0) (i32.add (i32.const 2048) (local.get $n)))
        (i32.store (i32.const 4) (i32.sub (i32.const 129024) (local.get $n)))
        (br_if $done (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
        (br_if $done (i32.eqz (i32.load (i32.const 8))))
        (local.set $n (i32.add (local.get $n) (i32.load (i32.const 8))))
        (br $more)))
    (local.get $n))

  (func (export "_start")
    (local $n i32) (local $i i32) (local $c i32) (local $quotes i32)
    (local $space i32) (local $inword i32) (local $words i32) (local $p i32)
    (local.set $n (i32.add (i32.const 2048) (call $read)))
    (local.set $i (i32.const 2048))
    ;; skip to just after the third '"': the opening quote of the value of "text"
    (block $found
      (loop $seek
        (br_if $found (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.eq (i32.load8_u (local.get $i)) (i32.const 34))
          (then (local.set $quotes (i32.add (local.get $quotes) (i32.const 1)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $found (i32.eq (local.get $quotes) (i32.const 3)))
        (br $seek)))
    (block $end
      (loop $next
        (br_if $end (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $c (i32.load8_u (local.get $i)))
        (br_if $end (i32.eq (local.get $c) (i32.const 34)))  ;; the closing quote
        (local.set $space (i32.eq (local.get $c) (i32.const 32)))
        (if (i32.eq (local.get $c) (i32.const 92))  ;; a backslash escape
          (then
            (local.set $i (i32.add (local.get $i) (i32.const 1)))
            (local.set $c (i32.load8_u (local.get $i)))
            (local.set $space (i32.or (i32.eq (local.get $c) (i32.const 110))     ;; \n
              (i32.or (i32.eq (local.get $c) (i32.const 116))                     ;; \t
                      (i32.eq (local.get $c) (i32.const 114)))))                  ;; \r
            (if (i32.eq (local.get $c) (i32.const 117))  ;; \uXXXX: a character, no space
              (then (local.set $i (i32.add (local.get $i) (i32.const 4)))))))
        (if (local.get $space)
          (then (local.set $inword (i32.const 0)))
          (else
            (if (i32.eqz (local.get $inword))
              (then (local.set $words (i32.add (local.get $words) (i32.const 1)))))
            (local.set $inword (i32.const 1))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    ;; the count in decimal, written backwards from 1120
    (local.set $p (i32.const 1120))
    (loop $digit
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (i32.store8 (local.get $p) (i32.add (i32.const 48) (i32.rem_u (local.get $words) (i32.const 10))))
      (local.set $words (i32.div_u (local.get $words) (i32.const 10)))
      (br_if $digit (local.get $words)))
    (call $write (i32.const 1024) (i32.const 9))
    (call $write (local.get $p) (i32.sub (i32.const 1120) (local.get $p)))
    (call $write (i32.const 1040) (i32.const 2)))
)
