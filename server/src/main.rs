fn main() {
    println!("remat");
}
