//! The `portwise` command: `run` the controller, `check` one checker
//! against one pod without deploying anything, or print the `crd`.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "portwise",
    // The version, the git revision and the commit's date (build.rs).
    version = portwise::build::LONG_VERSION,
    about = "Publishes per-port EndpointSlices for colocated, selector-less Services"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
struct LogArgs {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `portwise=debug`;
    /// default: RUST_LOG, else `info`.
    #[arg(long, env = "PORTWISE_LOG", global = true)]
    log_level: Option<String>,
    /// `text` or `json`.
    #[arg(
        long,
        env = "PORTWISE_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: portwise::ops::logging::LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller.
    Run(portwise::cli::RunArgs),
    /// Run a checker against one pod and Service and print the verdict.
    Check(portwise::cli::CheckArgs),
    /// Print the MembershipPolicy CustomResourceDefinition (YAML), as
    /// deploy/helm/crds and deploy/kustomize hold it.
    Crd,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = portwise::ops::logging::init(cli.log.log_format, cli.log.log_level.as_deref()) {
        eprintln!("portwise: {e}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Run(args) => portwise::cli::run(args).await,
        Command::Check(args) => portwise::cli::check(args).await,
        Command::Crd => portwise::cli::crd(),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("portwise: {e:#}");
            ExitCode::from(1)
        }
    }
}
