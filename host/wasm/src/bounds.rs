//! What the compiler is handed, bounded: a component's size, how many
//! functions its core modules define and the largest function body,
//! checked with `wasmparser` (section framing only, no validation) before
//! cranelift sees the bytes. Cranelift's memory grows with a function's
//! size and the compile's with their number: a few MiB of one huge
//! function, which a 1 MiB gzip can hold, would take the controller's
//! memory with it.

use crate::Limits;

/// What the bounds measure of a component.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileFigures {
    pub bytes: usize,
    /// Core modules, nested ones included.
    pub modules: usize,
    /// Function bodies of all its core modules.
    pub functions: u64,
    /// The largest function body, in bytes.
    pub largest_function: usize,
}

/// `n` bytes, in MiB or KiB when that is how big it is.
fn size(n: usize) -> String {
    if n >= 1 << 20 {
        let mib = n as f64 / f64::from(1 << 20);
        if n.is_multiple_of(1 << 20) {
            format!("{mib:.0} MiB")
        } else {
            format!("{mib:.1} MiB")
        }
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{n} bytes")
    }
}

/// Why a component is not handed to the compiler. Every message starts
/// with the module's name.
#[derive(Debug, thiserror::Error)]
pub enum BoundsError {
    #[error(
        "{module}: the component is {}, above the {} compile limit",
        size(*bytes),
        size(*limit)
    )]
    Component {
        module: String,
        bytes: usize,
        limit: usize,
    },
    #[error("{module}: not a valid component: {source}")]
    Parse {
        module: String,
        #[source]
        source: wasmparser::BinaryReaderError,
    },
    #[error(
        "{module}: more than {limit} functions (core module {core_module} alone defines \
         {count}), above the compile limit"
    )]
    Functions {
        module: String,
        limit: u64,
        /// Which core module, counting from 1, crossed the limit.
        core_module: usize,
        count: u32,
    },
    #[error(
        "{module}: function body {body} of core module {core_module} is {}, above the {} \
         compile limit",
        size(*bytes),
        size(*limit)
    )]
    FunctionBody {
        module: String,
        body: u32,
        core_module: usize,
        bytes: usize,
        limit: usize,
    },
}

/// Measures `component` and refuses it when a figure is past `limits`.
/// The message starts with `name` (the module's file name or reference)
/// and says which figure, by how much, and which limit.
pub fn check(name: &str, component: &[u8], limits: &Limits) -> Result<CompileFigures, BoundsError> {
    if component.len() > limits.max_component_bytes {
        return Err(BoundsError::Component {
            module: name.to_string(),
            bytes: component.len(),
            limit: limits.max_component_bytes,
        });
    }
    measure(name, component, Some(limits))
}

/// The figures of `component`; with `limits`, stopping at the first one
/// past its bound.
pub fn measure(
    name: &str,
    component: &[u8],
    limits: Option<&Limits>,
) -> Result<CompileFigures, BoundsError> {
    use wasmparser::{Parser, Payload};
    let mut figures = CompileFigures {
        bytes: component.len(),
        ..CompileFigures::default()
    };
    // The position of the body in its module's code section.
    let mut body = 0u32;
    for payload in Parser::new(0).parse_all(component) {
        let payload = payload.map_err(|source| BoundsError::Parse {
            module: name.to_string(),
            source,
        })?;
        match payload {
            Payload::ModuleSection { .. } => figures.modules += 1,
            Payload::CodeSectionStart { count, .. } => {
                body = 0;
                figures.functions += u64::from(count);
                if let Some(limits) = limits
                    && figures.functions > limits.max_functions
                {
                    return Err(BoundsError::Functions {
                        module: name.to_string(),
                        limit: limits.max_functions,
                        core_module: figures.modules,
                        count,
                    });
                }
            }
            Payload::CodeSectionEntry(f) => {
                let len = f.range().len();
                figures.largest_function = figures.largest_function.max(len);
                if let Some(limits) = limits
                    && len > limits.max_function_bytes
                {
                    return Err(BoundsError::FunctionBody {
                        module: name.to_string(),
                        body,
                        core_module: figures.modules,
                        bytes: len,
                        limit: limits.max_function_bytes,
                    });
                }
                body += 1;
            }
            _ => {}
        }
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component wrapping one core module whose code section holds
    /// `bodies` (each a function body: size-prefixed locals and code).
    fn component_with_bodies(bodies: &[Vec<u8>]) -> Vec<u8> {
        fn leb(mut n: usize, out: &mut Vec<u8>) {
            loop {
                let byte = (n & 0x7f) as u8;
                n >>= 7;
                if n == 0 {
                    out.push(byte);
                    return;
                }
                out.push(byte | 0x80);
            }
        }
        fn section(id: u8, content: &[u8], out: &mut Vec<u8>) {
            out.push(id);
            leb(content.len(), out);
            out.extend_from_slice(content);
        }
        let mut module = b"\0asm\x01\0\0\0".to_vec();
        // Type section: one type, () -> ().
        section(1, &[1, 0x60, 0, 0], &mut module);
        // Function section: every body of type 0.
        let mut funcs = Vec::new();
        leb(bodies.len(), &mut funcs);
        funcs.extend(std::iter::repeat_n(0u8, bodies.len()));
        section(3, &funcs, &mut module);
        let mut code = Vec::new();
        leb(bodies.len(), &mut code);
        for b in bodies {
            leb(b.len(), &mut code);
            code.extend_from_slice(b);
        }
        section(10, &code, &mut module);
        let mut component = b"\0asm\x0d\0\x01\0".to_vec();
        // Component core-module section (id 1).
        section(1, &module, &mut component);
        component
    }

    /// A body of `n` bytes: no locals, `n - 2` nops, end.
    fn body(n: usize) -> Vec<u8> {
        let mut b = vec![0u8];
        b.extend(std::iter::repeat_n(0x01, n - 2));
        b.push(0x0b);
        b
    }

    #[test]
    fn figures_are_measured_across_core_modules() {
        let c = component_with_bodies(&[body(10), body(300), body(20)]);
        let f = measure("x.wasm", &c, None).unwrap();
        assert_eq!(
            f,
            CompileFigures {
                bytes: c.len(),
                modules: 1,
                functions: 3,
                largest_function: 300
            }
        );
        assert!(check("x.wasm", &c, &Limits::default()).is_ok());
    }

    #[test]
    fn a_component_past_a_bound_is_refused_naming_the_file_and_figure() {
        let c = component_with_bodies(&[body(10), body((3 << 20) + 100_000)]);
        let limits = Limits {
            max_function_bytes: 2 << 20,
            ..Limits::default()
        };
        let e = check("x.wasm", &c, &limits).unwrap_err();
        assert!(
            matches!(
                &e,
                BoundsError::FunctionBody { module, body: 1, core_module: 1, limit, .. }
                    if module == "x.wasm" && *limit == 2 << 20
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "x.wasm: function body 1 of core module 1 is 3.1 MiB, above the 2 MiB compile limit"
        );
        let many = component_with_bodies(&vec![body(2); 1000]);
        let limits = Limits {
            max_functions: 999,
            ..Limits::default()
        };
        let e = check("y.wasm.gz", &many, &limits).unwrap_err().to_string();
        assert!(
            e.starts_with("y.wasm.gz: more than 999 functions (core module 1 alone defines 1000)"),
            "{e}"
        );
        let limits = Limits {
            max_component_bytes: many.len() - 1,
            ..Limits::default()
        };
        let e = check("z.wasm", &many, &limits).unwrap_err().to_string();
        assert!(
            e.starts_with("z.wasm: the component is ") && e.contains("above the"),
            "{e}"
        );
        let e = check("t.wasm", &many[..many.len() - 3], &Limits::default()).unwrap_err();
        assert!(matches!(e, BoundsError::Parse { .. }), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with("t.wasm: not a valid component: "), "{e}");
    }
}
