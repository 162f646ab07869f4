"""Independent CRC32C references for dev/test/test_crc32c.sh.

Prints "crc32c bytes path" for each file, like `test_crc32c FILE...`:
  crc32c_reference.py bitwise FILE...   one bit at a time from the definition
                                        (reflected polynomial 0x82F63B78, init and
                                        final xor 0xFFFFFFFF), no tables
  crc32c_reference.py crcmod FILE...    the crcmod package's 'crc-32c'; exit 3 if it
                                        is not installed
"""
import sys

POLY = 0x82F63B78


def crc32c_bitwise(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ POLY if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def main():
    mode, paths = sys.argv[1], sys.argv[2:]
    if mode == "bitwise":
        fn = crc32c_bitwise
    elif mode == "crcmod":
        try:
            import crcmod.predefined
        except ImportError:
            sys.exit(3)
        fn = crcmod.predefined.mkCrcFun("crc-32c")
    else:
        sys.exit("usage: crc32c_reference.py bitwise|crcmod FILE...")
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        print("%08x %d %s" % (fn(data), len(data), path))


if __name__ == "__main__":
    main()
