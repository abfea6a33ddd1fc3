//! Compiles `proto/` with protox (a pure-Rust protobuf compiler), so no system `protoc` is needed.
fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("hookline/v1/hookline.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::compile([&file], [&root]).expect("proto/ compiles");
    prost_build::Config::new().bytes(["."]).compile_fds(descriptors).expect("prost code generation");
}
