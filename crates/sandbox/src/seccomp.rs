//! A seccomp filter that stops the sandboxed command from typing into the caller's
//! terminal.
//!
//! Without `--new-session` (kept off for interactive use, see `layout.rs`) the command
//! shares the caller's controlling terminal, and the `TIOCSTI` ioctl would let it push
//! keystrokes into the caller's shell input, which that shell runs after `exec` ends: an
//! escape from the sandbox. `TIOCLINUX` can do the same on a Linux virtual console. The
//! filter makes both ioctls fail with `EPERM` and allows every other system call.
//!
//! The kernel compares only the low 32 bits of the ioctl request, so the filter does too
//! (comparing all 64 bits would let a request with high bits set slip through).
//! System calls of an architecture the filter does not know (x32 on x86_64) are refused
//! by killing the process, so the check cannot be bypassed through another ABI.
//!
//! The result is a classic BPF program in the form `bwrap --seccomp FD` reads (an array of
//! `struct sock_filter`, native byte order).

/// `struct seccomp_data` offsets (bytes).
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// Low 32 bits of `args[1]` (the ioctl request), which starts at byte 24.
const OFF_ARG1_LO: u32 = if cfg!(target_endian = "little") {
    24
} else {
    28
};

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;

const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541c;

/// One ABI the filter handles.
struct Abi {
    /// `AUDIT_ARCH_*` value in `seccomp_data.arch`.
    audit_arch: u32,
    /// Number of the `ioctl` system call in this ABI.
    ioctl_nr: u32,
    /// System call numbers at or above this belong to another ABI sharing `audit_arch`
    /// (x32 on x86_64) and are refused.
    foreign_from: Option<u32>,
}

#[cfg(target_arch = "x86_64")]
const ABIS: &[Abi] = &[
    Abi {
        audit_arch: 0xc000_003e, // AUDIT_ARCH_X86_64
        ioctl_nr: 16,
        foreign_from: Some(0x4000_0000), // __X32_SYSCALL_BIT
    },
    Abi {
        audit_arch: 0x4000_0003, // AUDIT_ARCH_I386
        ioctl_nr: 54,
        foreign_from: None,
    },
];

#[cfg(target_arch = "aarch64")]
const ABIS: &[Abi] = &[
    Abi {
        audit_arch: 0xc000_00b7, // AUDIT_ARCH_AARCH64
        ioctl_nr: 29,
        foreign_from: None,
    },
    Abi {
        audit_arch: 0x4000_0028, // AUDIT_ARCH_ARM
        ioctl_nr: 54,
        foreign_from: None,
    },
];

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ABIS: &[Abi] = &[];

/// A jump target: the next instruction or a label.
#[derive(Clone, Copy)]
enum Jump {
    Next,
    To(usize),
}

struct Insn {
    code: u16,
    k: u32,
    jt: Jump,
    jf: Jump,
}

/// A tiny BPF assembler with forward labels.
#[derive(Default)]
struct Asm {
    insns: Vec<Insn>,
    labels: Vec<usize>,
}

impl Asm {
    fn label(&mut self) -> usize {
        self.labels.push(usize::MAX);
        self.labels.len() - 1
    }
    fn bind(&mut self, label: usize) {
        self.labels[label] = self.insns.len();
    }
    fn push(&mut self, code: u16, k: u32, jt: Jump, jf: Jump) {
        self.insns.push(Insn { code, k, jt, jf });
    }
    fn load(&mut self, offset: u32) {
        self.push(BPF_LD_W_ABS, offset, Jump::Next, Jump::Next);
    }
    fn ret(&mut self, value: u32) {
        self.push(BPF_RET_K, value, Jump::Next, Jump::Next);
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.insns.len() * 8);
        for (i, insn) in self.insns.iter().enumerate() {
            let rel = |j: Jump| -> u8 {
                match j {
                    Jump::Next => 0,
                    Jump::To(label) => {
                        let target = self.labels[label];
                        assert!(target > i && target != usize::MAX, "BPF jumps go forward");
                        u8::try_from(target - i - 1).expect("the filter is far below 256 insns")
                    }
                }
            };
            out.extend_from_slice(&insn.code.to_ne_bytes());
            out.push(rel(insn.jt));
            out.push(rel(insn.jf));
            out.extend_from_slice(&insn.k.to_ne_bytes());
        }
        out
    }
}

/// The filter program, or `None` on an architecture this module has no table for (the
/// sandbox then relies on `--new-session` alone).
pub(crate) fn tty_injection_filter() -> Option<Vec<u8>> {
    if ABIS.is_empty() {
        return None;
    }
    let mut a = Asm::default();
    let allow = a.label();
    let deny = a.label();
    let check_request = a.label();
    let blocks: Vec<usize> = ABIS.iter().map(|_| a.label()).collect();

    a.load(OFF_ARCH);
    for (abi, block) in ABIS.iter().zip(&blocks) {
        a.push(BPF_JEQ_K, abi.audit_arch, Jump::To(*block), Jump::Next);
    }
    a.ret(RET_KILL_PROCESS);
    for (abi, block) in ABIS.iter().zip(&blocks) {
        a.bind(*block);
        a.load(OFF_NR);
        if let Some(foreign) = abi.foreign_from {
            let own = a.label();
            a.push(BPF_JGE_K, foreign, Jump::Next, Jump::To(own));
            a.ret(RET_KILL_PROCESS);
            a.bind(own);
        }
        a.push(
            BPF_JEQ_K,
            abi.ioctl_nr,
            Jump::To(check_request),
            Jump::To(allow),
        );
    }
    a.bind(check_request);
    a.load(OFF_ARG1_LO);
    a.push(BPF_JEQ_K, TIOCSTI, Jump::To(deny), Jump::Next);
    a.push(BPF_JEQ_K, TIOCLINUX, Jump::To(deny), Jump::To(allow));
    a.bind(allow);
    a.ret(RET_ALLOW);
    a.bind(deny);
    a.ret(RET_ERRNO | libc::EPERM as u32);
    Some(a.bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the program the way the kernel would, on one `seccomp_data`.
    fn eval(prog: &[u8], arch: u32, nr: u32, arg1: u64) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        data[24..32].copy_from_slice(&arg1.to_ne_bytes());
        let insns: Vec<(u16, u8, u8, u32)> = prog
            .chunks(8)
            .map(|c| {
                (
                    u16::from_ne_bytes([c[0], c[1]]),
                    c[2],
                    c[3],
                    u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect();
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let (code, jt, jf, k) = insns[pc];
            pc += 1;
            match code {
                BPF_LD_W_ABS => {
                    let o = k as usize;
                    acc = u32::from_ne_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
                }
                BPF_JEQ_K => pc += usize::from(if acc == k { jt } else { jf }),
                BPF_JGE_K => pc += usize::from(if acc >= k { jt } else { jf }),
                BPF_RET_K => return k,
                other => panic!("unexpected opcode {other:#x}"),
            }
        }
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn blocks_terminal_injection_only() {
        let prog = tty_injection_filter().unwrap();
        assert_eq!(prog.len() % 8, 0);
        let eperm = RET_ERRNO | libc::EPERM as u32;
        for abi in ABIS {
            let (arch, ioctl) = (abi.audit_arch, abi.ioctl_nr);
            assert_eq!(eval(&prog, arch, ioctl, TIOCSTI.into()), eperm);
            assert_eq!(eval(&prog, arch, ioctl, TIOCLINUX.into()), eperm);
            // high bits are ignored by the kernel, so by the filter too
            assert_eq!(
                eval(&prog, arch, ioctl, (1 << 32) | u64::from(TIOCSTI)),
                eperm
            );
            assert_eq!(eval(&prog, arch, ioctl, 0x5401), RET_ALLOW); // TCGETS
            assert_eq!(eval(&prog, arch, 0, TIOCSTI.into()), RET_ALLOW);
            if let Some(foreign) = abi.foreign_from {
                assert_eq!(eval(&prog, arch, foreign | 16, 0), RET_KILL_PROCESS);
            }
        }
        assert_eq!(eval(&prog, 0x1234, 16, 0), RET_KILL_PROCESS);
    }
}
