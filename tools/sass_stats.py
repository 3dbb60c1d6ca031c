#!/usr/bin/env python3
"""Helpers of tools/sass.sh (dev tool only).

retag IN OUT: a copy of an sm_90 cubin from CUDA 13's ptxas with the ELF header that CUDA 11.8
  wrote for sm_90 (OS ABI 0x33, ABI version 7, flags 0x5a055a), so 11.8's nvdisasm reads it.
lines SASS KERNEL SOURCE [--demangle CUFILT] [--top N]: for each kernel of `nvdisasm -c -gi` output
  (a cubin built with -lineinfo) whose mangled name holds KERNEL, its instructions by line of the
  source file named SOURCE (a file name, e.g. qgemv_kernel.cuh): each instruction counts for the
  outermost inlined frame that lies in SOURCE, so a call site counts all that is inlined under it
  (a function's size in the kernel, all its forms: what one launch runs of it is the reader's to
  work out). The N largest (25 by default), with the line's text.
loops SASS [KERNEL] [--demangle CUFILT] [--min N]: for each kernel of `nvdisasm -c` output whose
  mangled name holds KERNEL, its instruction count and, for each loop of at least N instructions
  (16 by default; a branch back to a label, innermost first), its instructions by opcode. A loop
  here is any such range: the retry branches of waits (a few instructions) are left out by N, and
  a range may hold paths taken on different iterations (a stage's whole and short forms), so read
  the SASS for which runs when. 11.8's nvdisasm leaves out what it cannot decode (about 4% of this
  project's kernels): an address with no line, and any label on it, so a loop's count is a floor
  and a branch may name a label that is not printed.
path SASS KERNEL FROM TO [--take ADDR,...] [--demangle CUFILT]: the instructions one warp issues on
  a straight path of the first kernel whose mangled name holds KERNEL, from address FROM to TO
  (hex, as nvdisasm prints them), by opcode: unconditional branches are followed, predicated ones
  and BRA.DIV fall through (a barrier's retry: the stage has landed) unless their address is in
  --take. What one iteration of a loop costs on a given path (a row block a warp does not sum,
  say): a floor on its issue slots, whatever its stalls. A branch it must follow to a label the
  disassembler left out stops it (count that path by hand).
"""
import collections
import re
import struct
import subprocess
import sys


def retag(src, dst):
    b = bytearray(open(src, 'rb').read())
    if b[:4] != b'\x7fELF':
        sys.exit(f'{src}: not an ELF file')
    flags = struct.unpack_from('<I', b, 48)[0]
    if b[7] == 0x33 and flags == 0x5A055A:
        pass  # already in 11.8's form
    elif b[7] != 0x41 or b[8] != 8:
        sys.exit(f'{src}: an ELF header this script does not know (OS ABI {b[7]:#x}, ABI version {b[8]})')
    b[7], b[8] = 0x33, 7
    struct.pack_into('<I', b, 48, 0x5A055A)
    open(dst, 'wb').write(b)


def kernels(text):
    for part in re.split(r'\n(?=\s*\.section\s+\.text\.)', text):
        m = re.search(r'\.section\s+\.text\.(\S+?),', part)
        if m:
            yield m.group(1), part


def instructions(part):
    """(address, text) of each instruction, and each label's address."""
    ins, labels, pending = [], {}, []
    for line in part.splitlines():
        lab = re.match(r'\s*(\.L_x_\d+):', line)
        if lab:
            pending.append(lab.group(1))
            continue
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', line)
        if m:
            addr = int(m.group(1), 16)
            for p in pending:
                labels[p] = addr
            pending = []
            ins.append((addr, m.group(2)))
    return ins, labels


PREDICATE = re.compile(r'^@!?U?P[T\d]+\s+')  # an instruction's guard, "@!P0 "
BRANCH = re.compile(r'\bBRA\b.*`\((\.L_x_\d+)\)')  # a branch and its label


def opcode(text):
    return PREDICATE.sub('', text).split()[0].split('.')[0]


def demangled(name, cufilt):
    """name as CUFILT (cu++filt) prints it, or as it is without one."""
    if not cufilt:
        return name
    return subprocess.run([cufilt, name], capture_output=True, text=True).stdout.strip() or name


def loops(path, pattern, cufilt, least):
    text = open(path).read()
    found = False
    for name, part in kernels(text):
        if pattern and pattern not in name:
            continue
        found = True
        shown = demangled(name, cufilt)
        ins, labels = instructions(part)
        missing = (ins[-1][0] - ins[0][0]) // 16 + 1 - len(ins) if ins else 0
        print(f'== {shown}\n   {len(ins)} instructions, {missing} more not shown')
        spans = []
        for addr, t in ins:
            b = BRANCH.search(t)
            if b and b.group(1) in labels and labels[b.group(1)] <= addr:
                spans.append((labels[b.group(1)], addr))
        for begin, end in sorted(set(spans), key=lambda s: s[1] - s[0]):
            body = [t for a, t in ins if begin <= a <= end]
            if len(body) < least:
                continue
            count = collections.Counter(opcode(t) for t in body)
            ops = ' '.join(f'{k} {v}' for k, v in count.most_common())
            print(f'   loop {begin:#06x}-{end:#06x}: {len(body)}: {ops}')
    if not found:
        sys.exit(f'{path}: no kernel whose mangled name holds {pattern!r}')


def lines(path, pattern, source, cufilt, top):
    text = open(path).read()
    found = False
    for name, part in kernels(text):
        if pattern not in name:
            continue
        found = True
        shown = demangled(name, cufilt)
        count = collections.Counter()
        paths = {}
        chain, key = [], None
        for line in part.splitlines():
            f = re.match(r'\s*//## File "([^"]+)", line (\d+)(.*)', line)
            if f:  # a frame; innermost first, the chain ends with one not inlined
                chain.append((f.group(1), int(f.group(2))))
                if 'inlined at' not in f.group(3):
                    key = None
                    for file, ln in chain:
                        if file.rsplit('/', 1)[-1] == source:
                            key = ln  # the outermost such frame wins
                            paths[source] = file
                    chain = []
                continue
            if re.match(r'\s*/\*[0-9a-f]{4,}\*/', line):
                count[key] += 1
        total = sum(count.values())
        print(f'== {shown}\n   {total} instructions, {total - count[None]} under lines of {source}')
        src = []
        if source in paths:
            try:
                src = open(paths[source]).read().splitlines()
            except OSError:
                pass
        for ln, n in sorted(((k, v) for k, v in count.items() if k is not None), key=lambda kv: -kv[1])[:top]:
            body = src[ln - 1].strip()[:90] if 0 < ln <= len(src) else ''
            print(f'   {n:6d}  {source}:{ln:<5d} {body}')
    if not found:
        sys.exit(f'{path}: no kernel whose mangled name holds {pattern!r}')


def path(sass, pattern, begin, end, take, cufilt):
    for name, part in kernels(open(sass).read()):
        if pattern not in name:
            continue
        ins, labels = instructions(part)
        at = {a: i for i, (a, _) in enumerate(ins)}
        if begin not in at or end not in at:
            sys.exit(f'{sass}: no instruction at {begin:#x} or {end:#x} in {name}')
        count, i, steps = collections.Counter(), at[begin], 0
        while True:
            addr, t = ins[i]
            count[opcode(t)] += 1
            steps += 1
            if addr == end:
                break
            if steps > 100000:
                sys.exit(f'{sass}: no way from {begin:#x} to {end:#x} in {name} (a loop on the path?)')
            b = BRANCH.search(t)
            # a predicated branch, or BRA.DIV (taken only when the warp has diverged)
            predicated = PREDICATE.match(t) or t.startswith('BRA.DIV')
            if b and (not predicated or addr in take):
                if b.group(1) not in labels:
                    sys.exit(f'{sass}: the branch at {addr:#x} goes to {b.group(1)}, which the listing leaves out')
                i = at[labels[b.group(1)]]
            elif i + 1 < len(ins):
                i += 1
            else:
                sys.exit(f'{sass}: the path from {begin:#x} ran off the end of {name}')
        shown = demangled(name, cufilt)
        ops = ' '.join(f'{k} {v}' for k, v in count.most_common())
        print(f'== {shown}\n   path {begin:#06x}-{end:#06x}: {steps}: {ops}')
        return
    sys.exit(f'{sass}: no kernel whose mangled name holds {pattern!r}')


def take_options(args, opts):
    """opts (option -> default) with the values given in args, which loses them."""
    for key in opts:
        if key in args:
            i = args.index(key)
            opts[key] = args[i + 1]
            del args[i:i + 2]
    return opts


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == 'retag':
        retag(args[1], args[2])
    elif len(args) >= 2 and args[0] == 'loops':
        opts = take_options(args, {'--demangle': None, '--min': '16'})
        loops(args[1], args[2] if len(args) > 2 else '', opts['--demangle'], int(opts['--min']))
    elif len(args) >= 4 and args[0] == 'lines':
        opts = take_options(args, {'--demangle': None, '--top': '25'})
        lines(args[1], args[2], args[3], opts['--demangle'], int(opts['--top']))
    elif len(args) >= 5 and args[0] == 'path':
        opts = take_options(args, {'--demangle': None, '--take': ''})
        take = {int(a, 16) for a in opts['--take'].split(',') if a}
        path(args[1], args[2], int(args[3], 16), int(args[4], 16), take, opts['--demangle'])
    else:
        sys.exit(__doc__)


if __name__ == '__main__':
    main()
