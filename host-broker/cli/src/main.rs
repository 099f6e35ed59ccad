//! `dormouse`: the command-line client of the Dormouse broker. A thin shell
//! over [`dormouse_cli::main`].

fn main() -> std::process::ExitCode {
    dormouse_cli::main()
}
