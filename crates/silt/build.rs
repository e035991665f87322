//! Compiles the admin API's protobuf (proto/silt/admin/v1/admin.proto) into its tonic server
//! and client; needs `protoc` (Debian `protobuf-compiler`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        // `silt status --json` and the like print the messages as they are.
        .type_attribute(".silt.admin.v1", "#[derive(serde::Serialize)]")
        .compile_protos(&["proto/silt/admin/v1/admin.proto"], &["proto"])?;
    Ok(())
}
