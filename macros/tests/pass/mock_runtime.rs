//! A valid binding against a stand-in runtime (`runtime = crate::mock`): the expansion is a
//! `fn main` that calls `binding::main::<S, P>(config, build_info)` with the marker types.

mod mock {
    pub mod binding {
        use std::any::type_name;
        use std::process::ExitCode;

        pub struct Fsdp;
        pub struct Bf16Mixed;

        pub struct BuildInfo {
            pub verlc_version: &'static str,
            pub config_hash: &'static str,
            pub source: &'static str,
            pub spec: &'static str,
            pub bound_keys: &'static str,
            pub verl_release: &'static str,
            pub verl_tree: &'static str,
        }

        pub fn main<S, P>(config: &str, info: BuildInfo) -> ExitCode {
            assert!(type_name::<S>().ends_with("binding::Fsdp"));
            assert!(type_name::<P>().ends_with("binding::Bf16Mixed"));
            assert_eq!(config, "trainer:\n  device: cpu\n");
            assert_eq!((info.verlc_version, info.config_hash, info.source), ("0.1.0", "sha256:00ff", "quickstart.yaml"));
            assert_eq!(info.spec, "{\"binding\": {}}");
            assert_eq!(info.bound_keys, "[]");
            assert_eq!(info.verl_release, "0.9.1");
            assert_eq!(info.verl_tree, "{\"files\": {}}");
            ExitCode::SUCCESS
        }
    }
}

verlc_macros::bind_trainer! {
    strategy = Fsdp,
    precision = Bf16Mixed,
    config = concat!("trainer:\n", "  device: cpu\n"),
    spec = "{\"binding\": {}}",
    bound_keys = "[]",
    verlc_version = "0.1.0",
    config_hash = "sha256:00ff",
    source = "quickstart.yaml",
    verl_release = "0.9.1",
    verl_tree = "{\"files\": {}}",
    runtime = crate::mock,
}
