//! `wit-bindgen c` and `wit-bindgen go`, as `wit-bindgen-cli` 0.63 runs them:
//! parse the WIT path, pick the world, let the language's generator write
//! its files into `--out-dir`. Only the arguments the guest builds use are
//! offered; the generators' own options are theirs, flattened unchanged.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use wit_bindgen_core::{Files, WorldGenerator, wit_parser::Resolve};

#[derive(Debug, Parser)]
#[command(version = concat!(env!("CARGO_PKG_VERSION"), " (wit-bindgen 0.63.0, c and go generators)"))]
enum Opt {
    /// Generates bindings for C guest modules.
    C {
        #[clap(flatten)]
        opts: wit_bindgen_c::Opts,
        #[clap(flatten)]
        args: Common,
    },
    /// Generates bindings for Go guest modules.
    Go {
        #[clap(flatten)]
        opts: wit_bindgen_go::Opts,
        #[clap(flatten)]
        args: Common,
    },
}

#[derive(Debug, Parser)]
struct Common {
    /// Where to place output files.
    #[clap(long = "out-dir")]
    out_dir: PathBuf,
    /// A directory of `*.wit` files, or one `*.wit` file.
    #[clap(value_name = "WIT", index = 1)]
    wit: PathBuf,
    /// The world to generate bindings for.
    #[clap(short, long)]
    world: Option<String>,
}

fn main() -> Result<()> {
    let (generator, args) = match Opt::parse() {
        Opt::C { opts, args } => (opts.build(), args),
        Opt::Go { opts, args } => (opts.build(), args),
    };
    let files = generate(generator, &args)?;
    for (name, contents) in files.iter() {
        let dst = args.out_dir.join(name);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&dst, contents).with_context(|| format!("writing {}", dst.display()))?;
    }
    Ok(())
}

fn generate(mut generator: Box<dyn WorldGenerator>, args: &Common) -> Result<Files> {
    let mut resolve = Resolve::default();
    let (package, _) = resolve
        .push_path(&args.wit)
        .with_context(|| format!("parsing WIT at {}", args.wit.display()))?;
    let world = resolve.select_world(&[package], args.world.as_deref())?;
    let mut files = Files::default();
    generator.generate(&mut resolve, world, &mut files)?;
    Ok(files)
}
