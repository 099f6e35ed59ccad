//! `dormouse`: the command-line client of the Dormouse broker. A thin shell
//! over [`dormouse_broker::cli`].

fn main() -> std::process::ExitCode {
    dormouse_broker::cli::main()
}
