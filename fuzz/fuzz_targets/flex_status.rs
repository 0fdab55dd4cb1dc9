//! Fuzzes Flexvolume driver output parsing: any bytes a driver prints are judged without a panic, and an error's quoted head stays bounded.
#![no_main]

use kvol_flex::status::{judge, parse_status};
use kvol_flex::{Command, FlexError};
use libfuzzer_sys::fuzz_target;

const COMMANDS: [Command; 4] = [Command::Init, Command::Mount, Command::Attach, Command::GetVolumeName];

fuzz_target!(|data: &[u8]| {
    let (selector, output) = data.split_first().map_or((0, data), |(b, rest)| (*b, rest));
    let command = COMMANDS[usize::from(selector) % COMMANDS.len()];
    let failed_exit = (selector & 0x80 != 0).then_some("exit status: 1");
    let parsed = parse_status(output);
    match judge("fuzz/driver", command, output, failed_exit) {
        Err(FlexError::BadOutput { head, .. }) => {
            assert!(parsed.is_err(), "judged bad output that parses");
            assert!(head.chars().count() <= 210, "an error quotes {} characters", head.chars().count());
        }
        Ok(status) => assert_eq!(Some(&status.status), parsed.as_ref().ok().map(|s| &s.status)),
        Err(_) => assert!(parsed.is_ok()),
    }
});
