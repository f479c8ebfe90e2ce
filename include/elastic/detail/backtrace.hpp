// SPDX-License-Identifier: MIT
// Backtraces for elastic::record: capture with the unwinder, name frames from the executable's own
// ELF symbol table (so no -rdynamic is needed) or dladdr(3), with async-signal-safe code paths.
#pragma once

#include "elastic/detail/config.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include <cxxabi.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>
#include <unwind.h>

namespace elastic::inline v0::detail {

// A bounded character sink over a caller's buffer: no allocation, so the signal handler can use
// it. Output past the end is dropped and remembered (`truncated`).
class fixed_writer {
public:
    fixed_writer(char* buffer, std::size_t capacity) noexcept : buffer_(buffer), capacity_(capacity) {}

    void put(char c) noexcept {
        if (length_ + 1 < capacity_) {
            buffer_[length_++] = c;
            buffer_[length_] = '\0';
        } else {
            truncated_ = true;
        }
    }
    void put(const char* text, std::size_t size) noexcept {
        for (std::size_t i = 0; i < size; ++i) put(text[i]);
    }
    void put(const char* text) noexcept {
        if (text != nullptr) put(text, std::strlen(text));
    }
    void put_unsigned(std::uintmax_t value) noexcept {
        char digits[24];
        std::size_t n = 0;
        do {
            digits[n++] = static_cast<char>('0' + value % 10);
            value /= 10;
        } while (value != 0);
        while (n > 0) put(digits[--n]);
    }
    void put_signed(std::intmax_t value) noexcept {
        if (value < 0) {
            put('-');
            put_unsigned(static_cast<std::uintmax_t>(-(value + 1)) + 1);
        } else {
            put_unsigned(static_cast<std::uintmax_t>(value));
        }
    }
    void put_hex(std::uintptr_t value, int min_digits = 1) noexcept {
        char digits[2 * sizeof(value)];
        int n = 0;
        do {
            digits[n++] = "0123456789abcdef"[value & 0xf];
            value >>= 4;
        } while (value != 0);
        while (n < min_digits && n < static_cast<int>(sizeof(digits))) digits[n++] = '0';
        put("0x", 2);
        while (n > 0) put(digits[--n]);
    }

    [[nodiscard]] const char* data() const noexcept { return buffer_; }
    [[nodiscard]] std::size_t size() const noexcept { return length_; }
    [[nodiscard]] bool truncated() const noexcept { return truncated_; }

private:
    char* buffer_;
    std::size_t capacity_;
    std::size_t length_ = 0;
    bool truncated_ = false;
};

// JSON string content the way Python's json.dump writes it (ensure_ascii): ASCII as is except
// quote, backslash and controls; everything else as \uXXXX (UTF-16, surrogate pairs above the BMP);
// bytes that are not UTF-8 become U+FFFD. Works on any sink with put(char).
template <class Sink>
void json_escape(Sink& out, const char* text, std::size_t size) noexcept {
    const auto hex4 = [&out](unsigned code) noexcept {
        out.put('\\');
        out.put('u');
        for (int shift = 12; shift >= 0; shift -= 4) out.put("0123456789abcdef"[(code >> shift) & 0xf]);
    };
    std::size_t i = 0;
    while (i < size) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if (byte < 0x80) {
            ++i;
            switch (byte) {
                case '"':
                    out.put('\\');
                    out.put('"');
                    break;
                case '\\':
                    out.put('\\');
                    out.put('\\');
                    break;
                case '\n':
                    out.put('\\');
                    out.put('n');
                    break;
                case '\r':
                    out.put('\\');
                    out.put('r');
                    break;
                case '\t':
                    out.put('\\');
                    out.put('t');
                    break;
                case '\b':
                    out.put('\\');
                    out.put('b');
                    break;
                case '\f':
                    out.put('\\');
                    out.put('f');
                    break;
                default:
                    if (byte < 0x20 || byte == 0x7f) {  // Python escapes all but ' '..'~'
                        hex4(byte);
                    } else {
                        out.put(static_cast<char>(byte));
                    }
            }
            continue;
        }
        // Decode one UTF-8 sequence, strictly (no overlongs, no surrogates, at most U+10FFFF).
        std::size_t length = 0;
        unsigned code = 0;
        unsigned minimum = 0;
        if ((byte & 0xe0) == 0xc0) {
            length = 2;
            code = byte & 0x1fu;
            minimum = 0x80;
        } else if ((byte & 0xf0) == 0xe0) {
            length = 3;
            code = byte & 0x0fu;
            minimum = 0x800;
        } else if ((byte & 0xf8) == 0xf0) {
            length = 4;
            code = byte & 0x07u;
            minimum = 0x10000;
        }
        bool valid = length != 0 && i + length <= size;
        for (std::size_t k = 1; valid && k < length; ++k) {
            const auto next = static_cast<unsigned char>(text[i + k]);
            if ((next & 0xc0) != 0x80) {
                valid = false;
            } else {
                code = (code << 6) | (next & 0x3fu);
            }
        }
        if (valid && (code < minimum || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))) {
            valid = false;
        }
        if (!valid) {
            hex4(0xfffd);
            ++i;
            continue;
        }
        i += length;
        if (code >= 0x10000) {
            code -= 0x10000;
            hex4(0xd800 + (code >> 10));
            hex4(0xdc00 + (code & 0x3ff));
        } else {
            hex4(code);
        }
    }
}

/// One symbolized frame. Pointers refer to the mapped executable, the dynamic loader's tables or
/// static storage: nothing here is allocated.
struct frame_symbol {
    const char* function = nullptr;      // mangled name, or nullptr when unknown
    std::uintptr_t function_offset = 0;  // pc - start of the function
    const char* object = nullptr;        // the executable or shared object holding pc
    std::uintptr_t object_offset = 0;    // pc - load base of that object (what addr2line takes)
};

// The executable's static symbol table (.symtab), mapped read-only at install time. dladdr only
// sees the dynamic symbol table, which in an executable linked without -rdynamic holds almost
// nothing: the functions a user wants to see (the thrower, main) are only in .symtab.
struct executable_symbols {
    const unsigned char* image = nullptr;
    std::size_t image_size = 0;
    const ElfW(Sym) * symbols = nullptr;
    std::size_t symbol_count = 0;
    const char* strings = nullptr;
    std::size_t strings_size = 0;
    std::uintptr_t bias = 0;  // runtime address = st_value + bias
    bool loaded = false;
    char path[4096] = {};
};

inline executable_symbols exe_symbols_storage{};

// Maps /proc/self/exe and finds .symtab. Best effort and idempotent: on any failure frames fall
// back to dladdr. Done lazily, at the first symbolization (i.e. at the crash, by the one thread
// that reports), so that a healthy worker pays nothing: it only makes system calls (readlink,
// open, fstat, mmap, close), reads memory and getauxval, all usable in a signal handler.
inline void load_executable_symbols() noexcept {
    auto& exe = exe_symbols_storage;
    if (exe.loaded) return;
    exe.loaded = true;
    const ssize_t length = ::readlink("/proc/self/exe", exe.path, sizeof(exe.path) - 1);
    exe.path[length > 0 ? length : 0] = '\0';
    const int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat info {};
    if (::fstat(fd, &info) != 0 || info.st_size < static_cast<off_t>(sizeof(ElfW(Ehdr)))) {
        ::close(fd);
        return;
    }
    const auto size = static_cast<std::size_t>(info.st_size);
    void* const map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return;
    const auto* image = static_cast<const unsigned char*>(map);
    ElfW(Ehdr) header;
    std::memcpy(&header, image, sizeof(header));
    const bool usable = std::memcmp(header.e_ident, ELFMAG, SELFMAG) == 0 && header.e_shentsize == sizeof(ElfW(Shdr)) &&
                        header.e_shoff != 0 &&
                        header.e_shoff + std::size_t{header.e_shnum} * sizeof(ElfW(Shdr)) <= size;
    if (!usable) {
        ::munmap(map, size);
        return;
    }
    const auto* sections = reinterpret_cast<const ElfW(Shdr)*>(image + header.e_shoff);
    for (std::size_t i = 0; i < header.e_shnum; ++i) {
        if (sections[i].sh_type != SHT_SYMTAB || sections[i].sh_link >= header.e_shnum) continue;
        const auto& strings = sections[sections[i].sh_link];
        if (sections[i].sh_offset + sections[i].sh_size > size || strings.sh_offset + strings.sh_size > size) {
            continue;
        }
        exe.symbols = reinterpret_cast<const ElfW(Sym)*>(image + sections[i].sh_offset);
        exe.symbol_count = sections[i].sh_size / sizeof(ElfW(Sym));
        exe.strings = reinterpret_cast<const char*>(image + strings.sh_offset);
        exe.strings_size = strings.sh_size;
        break;
    }
    if (exe.symbols == nullptr) {  // stripped: dladdr will do what it can
        ::munmap(map, size);
        return;
    }
    // The load bias of a PIE: where the kernel put the program headers minus where the file says
    // they are (PT_PHDR, or the PT_LOAD segment that holds e_phoff).
    const auto at_phdr = static_cast<std::uintptr_t>(::getauxval(AT_PHDR));
    const auto phnum = static_cast<std::size_t>(::getauxval(AT_PHNUM));
    const auto* phdrs = reinterpret_cast<const ElfW(Phdr)*>(at_phdr);
    bool found = false;
    for (std::size_t i = 0; phdrs != nullptr && i < phnum && !found; ++i) {
        if (phdrs[i].p_type == PT_PHDR) {
            exe.bias = at_phdr - phdrs[i].p_vaddr;
            found = true;
        }
    }
    for (std::size_t i = 0; phdrs != nullptr && i < phnum && !found; ++i) {
        if (phdrs[i].p_type == PT_LOAD && phdrs[i].p_offset <= header.e_phoff &&
            header.e_phoff < phdrs[i].p_offset + phdrs[i].p_filesz) {
            exe.bias = at_phdr - (phdrs[i].p_vaddr + header.e_phoff - phdrs[i].p_offset);
            found = true;
        }
    }
    if (!found) {
        exe.symbols = nullptr;
        ::munmap(map, size);
        return;
    }
    exe.image = image;
    exe.image_size = size;
}

// Names the function holding `lookup` (a pc, or a return address minus one); offsets are reported
// against `pc`. Async-signal-safe as far as dladdr is (glibc's backtrace_symbols_fd relies on it
// the same way); the executable's table is mapped on first use (load_executable_symbols).
inline frame_symbol symbolize(std::uintptr_t pc, std::uintptr_t lookup) noexcept {
    load_executable_symbols();
    frame_symbol out;
    const auto& exe = exe_symbols_storage;
    if (exe.symbols != nullptr) {
        for (std::size_t i = 0; i < exe.symbol_count; ++i) {
            const auto& symbol = exe.symbols[i];
            if (ELF64_ST_TYPE(symbol.st_info) != STT_FUNC || symbol.st_size == 0 || symbol.st_value == 0 ||
                symbol.st_name >= exe.strings_size) {
                continue;
            }
            const std::uintptr_t start = symbol.st_value + exe.bias;
            if (lookup >= start && lookup < start + symbol.st_size) {
                out.function = exe.strings + symbol.st_name;
                out.function_offset = pc - start;
                out.object = exe.path;
                out.object_offset = pc - exe.bias;
                return out;
            }
        }
    }
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(lookup), &info) != 0) {
        out.object = info.dli_fname;
        out.object_offset = pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
        if (info.dli_sname != nullptr && info.dli_saddr != nullptr) {
            out.function = info.dli_sname;
            out.function_offset = pc - reinterpret_cast<std::uintptr_t>(info.dli_saddr);
        }
        // dladdr names the executable by argv[0] or ""; the real path is more use to addr2line.
        if (exe.path[0] != '\0' && exe.symbols != nullptr &&
            reinterpret_cast<std::uintptr_t>(info.dli_fbase) == exe.bias) {
            out.object = exe.path;
        }
    }
    return out;
}

inline _Unwind_Reason_Code backtrace_step(_Unwind_Context* context, void* argument) noexcept {
    auto& state = *static_cast<std::pair<void**, int>*>(argument);
    auto& [frames, remaining] = state;
    if (remaining == 0) return _URC_END_OF_STACK;
    *frames++ = reinterpret_cast<void*>(_Unwind_GetIP(context));
    --remaining;
    return _URC_NO_REASON;
}

// The human form of a frame, one line: "  #3 0x55d0c0de1234 in f(int)+0x1c (/bin/prog+0x1234)".
inline void put_frame(fixed_writer& out, int index, std::uintptr_t pc, const frame_symbol& symbol, bool demangle) {
    out.put("  #");
    out.put_unsigned(static_cast<std::uintmax_t>(index));
    out.put(' ');
    out.put_hex(pc);
    out.put(" in ");
    if (symbol.function == nullptr) {
        out.put("??");
    } else {
        char* readable = nullptr;
        if (demangle) {
            int status = 0;
            readable = abi::__cxa_demangle(symbol.function, nullptr, nullptr, &status);
        }
        out.put(readable != nullptr ? readable : symbol.function);
        std::free(readable);
        out.put('+');
        out.put_hex(symbol.function_offset);
    }
    if (symbol.object != nullptr && symbol.object[0] != '\0') {
        out.put(" (");
        out.put(symbol.object);
        out.put('+');
        out.put_hex(symbol.object_offset);
        out.put(')');
    }
    out.put('\n');
}

/// Captures the calling thread's stack (innermost first; frame 0 is this function). It calls the
/// unwinder every C++ program already links (libgcc_s) directly: glibc's backtrace(3) would
/// dlopen it on first use, which costs ~0.2 ms at start-up (to warm it) or is unsafe in a signal
/// handler (if not warmed). Walks through signal frames (the unwinder knows the kernel's
/// trampoline).
inline int capture_backtrace(void** frames, int capacity) noexcept {
    std::pair<void**, int> state{frames, capacity};
    _Unwind_Backtrace(backtrace_step, &state);
    return capacity - state.second;
}

/// In a signal handler's backtrace (`frames`, from capture_backtrace), the index of the frame of
/// the interrupted instruction (the handler and the kernel's trampoline come before it), or -1
/// when it is not found or unknown on this architecture. `context` is the handler's third
/// argument.
inline int interrupted_frame(void* const* frames, int count, void* context) noexcept {
    std::uintptr_t interrupted = 0;
#if defined(__x86_64__)
    interrupted = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
    interrupted = static_cast<std::uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.pc);
#else
    (void)context;
#endif
    for (int i = 0; i < count && interrupted != 0; ++i) {
        if (reinterpret_cast<std::uintptr_t>(frames[i]) == interrupted) return i;
    }
    return -1;
}

}  // namespace elastic::inline v0::detail
