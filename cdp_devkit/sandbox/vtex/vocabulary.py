"""Fixed word lists the generator draws from.

The generator stores indices into these tuples and the renderer looks the words up, so any edit here
(even appending) changes every generated store: treat it as a change to the test fixtures.
"""

from __future__ import annotations

import unicodedata

# Brazilian first names; the accented ones make sure consumers handle non-ASCII names and e-mail
# local parts derived from them.
FIRST_NAMES: tuple[str, ...] = (
    "José",
    "João",
    "Maria",
    "Ana",
    "Francisco",
    "Antônio",
    "Carlos",
    "Paulo",
    "Pedro",
    "Lucas",
    "Luiz",
    "Marcos",
    "Luís",
    "Gabriel",
    "Rafael",
    "Daniel",
    "Marcelo",
    "Bruno",
    "Eduardo",
    "Felipe",
    "Raimundo",
    "Rodrigo",
    "Conceição",
    "Francisca",
    "Antônia",
    "Adriana",
    "Juliana",
    "Márcia",
    "Fernanda",
    "Patrícia",
    "Aline",
    "Sandra",
    "Camila",
    "Amanda",
    "Bruna",
    "Jéssica",
    "Letícia",
    "Júlia",
    "Luciana",
    "Vanessa",
    "Mariana",
    "Gabriela",
    "Vitória",
    "Larissa",
    "Beatriz",
    "Fábio",
    "André",
    "Sebastião",
    "Inês",
    "Mônica",
    "Cláudia",
    "Thaís",
    "Vinícius",
    "Caio",
    "Otávio",
    "Débora",
    "Lúcia",
    "Andréia",
    "Renata",
    "Simone",
)

LAST_NAMES: tuple[str, ...] = (
    "Silva",
    "Santos",
    "Oliveira",
    "Souza",
    "Rodrigues",
    "Ferreira",
    "Alves",
    "Pereira",
    "Lima",
    "Gomes",
    "Costa",
    "Ribeiro",
    "Martins",
    "Carvalho",
    "Almeida",
    "Lopes",
    "Soares",
    "Fernandes",
    "Vieira",
    "Barbosa",
    "Rocha",
    "Dias",
    "Nascimento",
    "Andrade",
    "Moreira",
    "Nunes",
    "Marques",
    "Machado",
    "Mendes",
    "Freitas",
    "Cardoso",
    "Ramos",
    "Gonçalves",
    "Santana",
    "Teixeira",
    "Araújo",
    "Conceição",
    "Magalhães",
    "Simões",
    "Brandão",
    "Assunção",
    "Falcão",
    "Guimarães",
    "Leão",
    "Sá",
    "Peçanha",
    "Damião",
    "da Silva",
    "dos Santos",
    "de Souza",
)

# (domain, weight): a realistic skew towards the big webmail providers.
EMAIL_DOMAINS: tuple[tuple[str, float], ...] = (
    ("gmail.com", 0.45),
    ("hotmail.com", 0.17),
    ("outlook.com", 0.08),
    ("yahoo.com.br", 0.08),
    ("uol.com.br", 0.06),
    ("bol.com.br", 0.05),
    ("terra.com.br", 0.04),
    ("icloud.com", 0.07),
)

# (city, state, DDD area code, first five CEP digits, latitude, longitude, weight)
CITIES: tuple[tuple[str, str, int, int, float, float, float], ...] = (
    ("São Paulo", "SP", 11, 1000, -23.5505, -46.6333, 0.22),
    ("Rio de Janeiro", "RJ", 21, 20000, -22.9068, -43.1729, 0.12),
    ("Belo Horizonte", "MG", 31, 30100, -19.9167, -43.9345, 0.06),
    ("Brasília", "DF", 61, 70000, -15.7939, -47.8828, 0.05),
    ("Salvador", "BA", 71, 40000, -12.9777, -38.5016, 0.04),
    ("Fortaleza", "CE", 85, 60000, -3.7319, -38.5267, 0.04),
    ("Curitiba", "PR", 41, 80000, -25.4284, -49.2733, 0.05),
    ("Recife", "PE", 81, 50000, -8.0476, -34.8770, 0.04),
    ("Porto Alegre", "RS", 51, 90000, -30.0346, -51.2177, 0.05),
    ("Manaus", "AM", 92, 69000, -3.1190, -60.0217, 0.02),
    ("Belém", "PA", 91, 66000, -1.4558, -48.4902, 0.02),
    ("Goiânia", "GO", 62, 74000, -16.6869, -49.2648, 0.03),
    ("Campinas", "SP", 19, 13000, -22.9099, -47.0626, 0.04),
    ("São Luís", "MA", 98, 65000, -2.5307, -44.3068, 0.01),
    ("Florianópolis", "SC", 48, 88000, -27.5954, -48.5480, 0.03),
    ("Vitória", "ES", 27, 29000, -20.3155, -40.3128, 0.02),
    ("Natal", "RN", 84, 59000, -5.7945, -35.2110, 0.02),
    ("João Pessoa", "PB", 83, 58000, -7.1195, -34.8450, 0.02),
    ("Maceió", "AL", 82, 57000, -9.6658, -35.7350, 0.01),
    ("Ribeirão Preto", "SP", 16, 14000, -21.1704, -47.8103, 0.02),
    ("Santos", "SP", 13, 11000, -23.9608, -46.3336, 0.02),
    ("Niterói", "RJ", 21, 24000, -22.8832, -43.1034, 0.02),
    ("Uberlândia", "MG", 34, 38400, -18.9186, -48.2772, 0.01),
    ("Londrina", "PR", 43, 86000, -23.3045, -51.1696, 0.02),
    ("Joinville", "SC", 47, 89200, -26.3045, -48.8487, 0.02),
)

STREETS: tuple[str, ...] = (
    "Rua das Flores",
    "Avenida Paulista",
    "Rua Augusta",
    "Rua XV de Novembro",
    "Avenida Brasil",
    "Rua São João",
    "Rua da Consolação",
    "Avenida Atlântica",
    "Rua Sete de Setembro",
    "Rua Dom Pedro II",
    "Avenida Getúlio Vargas",
    "Rua Tiradentes",
    "Rua Marechal Deodoro",
    "Avenida Santos Dumont",
    "Rua Barão do Rio Branco",
    "Rua José Bonifácio",
)

NEIGHBORHOODS: tuple[str, ...] = (
    "Centro",
    "Jardim América",
    "Vila Mariana",
    "Boa Vista",
    "Copacabana",
    "Savassi",
    "Moinhos de Vento",
    "Batel",
    "Pinheiros",
    "Meireles",
    "Boa Viagem",
    "Asa Sul",
)

COMPLEMENTS: tuple[str, ...] = ("", "", "", "Apto 12", "Apto 304", "Casa 2", "Bloco B", "Fundos")

# Department id -> name, and categories as (category id, department id, name, product nouns).
DEPARTMENTS: dict[int, str] = {
    1: "Vestuário",
    2: "Calçados",
    3: "Casa",
    4: "Eletrônicos",
    5: "Beleza",
    6: "Esporte",
}
CATEGORIES: tuple[tuple[int, int, str, tuple[str, ...]], ...] = (
    (10, 1, "Camisetas", ("Camiseta", "Regata", "Polo")),
    (11, 1, "Calças", ("Calça", "Bermuda", "Jogger")),
    (12, 1, "Vestidos", ("Vestido", "Saia", "Macacão")),
    (13, 1, "Jaquetas", ("Jaqueta", "Moletom", "Corta-Vento")),
    (20, 2, "Tênis", ("Tênis", "Sapatênis")),
    (21, 2, "Sandálias", ("Sandália", "Chinelo", "Rasteira")),
    (22, 2, "Botas", ("Bota", "Coturno")),
    (30, 3, "Cama", ("Lençol", "Edredom", "Travesseiro")),
    (31, 3, "Mesa", ("Toalha de Mesa", "Jogo Americano", "Caneca")),
    (32, 3, "Banho", ("Toalha de Banho", "Roupão", "Tapete")),
    (33, 3, "Decoração", ("Vaso", "Luminária", "Almofada", "Quadro")),
    (40, 4, "Fones", ("Fone de Ouvido", "Headset", "Caixa de Som")),
    (41, 4, "Acessórios", ("Carregador", "Cabo USB-C", "Capa de Celular", "Power Bank")),
    (42, 4, "Smart Home", ("Lâmpada Inteligente", "Tomada Wi-Fi", "Câmera")),
    (50, 5, "Perfumes", ("Perfume", "Body Splash", "Colônia")),
    (51, 5, "Maquiagem", ("Batom", "Base", "Máscara de Cílios")),
    (52, 5, "Cuidados com a Pele", ("Hidratante", "Protetor Solar", "Sérum")),
    (60, 6, "Fitness", ("Halter", "Tapete de Yoga", "Garrafa Térmica")),
    (61, 6, "Ciclismo", ("Capacete", "Luva de Ciclismo", "Bomba de Ar")),
    (62, 6, "Camping", ("Barraca", "Saco de Dormir", "Lanterna")),
)

PRODUCT_ADJECTIVES: tuple[str, ...] = (
    "Básico",
    "Premium",
    "Clássico",
    "Esportivo",
    "Slim",
    "Conforto",
    "Essencial",
    "Urbano",
    "Vintage",
    "Tropical",
    "Leve",
    "Pro",
)
PRODUCT_LINES: tuple[str, ...] = (
    "Algodão",
    "Linho",
    "Couro",
    "Bambu",
    "Aço",
    "Seda",
    "Eco",
    "Max",
    "Air",
    "Plus",
)

# (brand id, name)
BRANDS: tuple[tuple[int, str], ...] = (
    (2000001, "Aurora"),
    (2000002, "Boto Rosa"),
    (2000003, "Capivara"),
    (2000004, "Dendê"),
    (2000005, "Estrela do Mar"),
    (2000006, "Flamboyant"),
    (2000007, "Guaraná & Co."),
    (2000008, "Ipê"),
    (2000009, "Jabuticaba"),
    (2000010, "Lua Nova"),
    (2000011, "Maré"),
    (2000012, "Nó Cego"),
    (2000013, "Onça"),
    (2000014, "Pitanga"),
    (2000015, "Quero-Quero"),
)

SKU_COLORS: tuple[str, ...] = (
    "Preto",
    "Branco",
    "Azul",
    "Vermelho",
    "Verde",
    "Cinza",
    "Rosa",
    "Amarelo",
)
SKU_SIZES: tuple[str, ...] = ("PP", "P", "M", "G", "GG", "XG")

# (paymentSystem id, name, group, weight)
PAYMENT_SYSTEMS: tuple[tuple[str, str, str, float], ...] = (
    ("2", "Visa", "creditCard", 0.30),
    ("4", "Mastercard", "creditCard", 0.25),
    ("1", "American Express", "creditCard", 0.05),
    ("6", "Boleto Bancário", "bankInvoice", 0.12),
    ("125", "Pix", "instantPayment", 0.28),
)

COURIERS: tuple[str, ...] = ("Correios", "Loggi", "Jadlog", "Total Express")

CANCEL_REASONS: tuple[str, ...] = (
    "Cliente desistiu da compra",
    "Pagamento não aprovado",
    "Produto sem estoque",
    "Endereço de entrega inválido",
)

UTM_SOURCES: tuple[str, ...] = ("google", "facebook", "instagram", "newsletter", "tiktok", "awin")
UTM_MEDIUMS: tuple[str, ...] = ("cpc", "social", "email", "affiliate")
UTM_CAMPAIGNS: tuple[str, ...] = (
    "black-friday",
    "verao",
    "dia-das-maes",
    "natal",
    "liquidacao",
    "always-on",
)


def ascii_fold(text: str) -> str:
    """Lower-case ASCII form of a name, as people type it into an e-mail address."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if c.isalnum() and c.isascii()).lower()


def slug(text: str) -> str:
    """URL slug as VTEX builds LinkId / DetailUrl from a product name."""
    decomposed = unicodedata.normalize("NFKD", text.lower())
    kept = "".join(
        c if (c.isascii() and c.isalnum()) else " "
        for c in decomposed
        if not unicodedata.combining(c)
    )
    return "-".join(kept.split())
