//! The command's logs: the `tracing` subscriber of `SOFTVERBS_LOG` / `RUST_LOG` (the
//! filter, `RUST_LOG` syntax; `SOFTVERBS_LOG` wins) and `SOFTVERBS_LOG_FILE` (append there
//! instead of stderr), the same one the drop-in installs
//! (`softverbs_device::logging`, which says what each level shows). With none set, no
//! subscriber: nothing is printed and nothing costs.

/// Installs the subscriber the environment asks for. A variable that cannot be honoured
/// (a filter that does not parse, a log file that cannot be opened) ends the command with
/// one line naming it and status 1, before anything runs: the user asked for a log they
/// would not get.
pub fn init() {
    if let Err(error) = softverbs_device::logging::init_from_env() {
        eprintln!("softverbs: {error}");
        std::process::exit(1);
    }
}
